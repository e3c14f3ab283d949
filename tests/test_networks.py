"""Tier (a) tests of agents/networks.py: shapes, parameter counts, initialization, activations and the
agreement of act() with evaluate()."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import Tensor, nn

from agents.networks import Actor, ActorCritic, NetworkSpec, StackedNetworks, adapt_step_size, refresh_reference
from agents.seeding import seed_everything
from agents.stacked import clip_grad_norms_

OBS_DIM = 4
B = 5


def make(continuous: bool, seed: int = 0, **kwargs: object) -> ActorCritic:
    """A seeded ActorCritic: 4-d observations, 2 actions (discrete) or 3 action dimensions (continuous)."""
    torch.manual_seed(seed)
    return ActorCritic(NetworkSpec(obs_dim=OBS_DIM, action_dim=3 if continuous else 2, continuous=continuous, **kwargs))


def observations(seed: int = 1) -> Tensor:
    return torch.randn(B, OBS_DIM, generator=torch.Generator().manual_seed(seed))  # (B, obs_dim)


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# --------------------------------------------------------------------------------------------------
# Shapes and parameter counts
# --------------------------------------------------------------------------------------------------


def test_discrete_shapes() -> None:
    model, obs = make(continuous=False), observations()
    logits, values = model.heads(obs)
    assert logits.shape == (B, 2) and values.shape == (B,)
    assert model.actor(obs).shape == (B, 2)
    assert model.value(obs).shape == (B,)
    with torch.inference_mode():
        act = model.act(obs)
    assert act.actions.shape == (B,) and act.actions.dtype == torch.int64
    assert act.log_probs.shape == (B,) and act.values.shape == (B,)
    assert ((act.actions >= 0) & (act.actions < 2)).all()
    # clone(): inference tensors cannot enter autograd; the rollout buffers copy them the same way.
    evaluation = model.evaluate(obs, act.actions.clone())
    assert evaluation.log_probs.shape == evaluation.entropy.shape == evaluation.values.shape == (B,)
    assert model.deterministic_action(obs).shape == (B,)
    assert model.actor.log_std is None


def test_continuous_shapes() -> None:
    model, obs = make(continuous=True), observations()
    means, values = model.heads(obs)
    assert means.shape == (B, 3) and values.shape == (B,)
    with torch.inference_mode():
        act = model.act(obs)
    assert act.actions.shape == (B, 3) and act.actions.dtype == torch.float32
    assert act.log_probs.shape == (B,) and act.values.shape == (B,)
    evaluation = model.evaluate(obs, act.actions.clone())
    assert evaluation.log_probs.shape == evaluation.entropy.shape == evaluation.values.shape == (B,)
    assert model.deterministic_action(obs).shape == (B, 3)


def test_parameter_counts_separate_and_shared_trunk() -> None:
    # obs 4 → 64 → 64:  trunk = (4·64 + 64) + (64·64 + 64) = 320 + 4160 = 4480
    # actor head 64·2 + 2 = 130, critic head 64 + 1 = 65
    # separate: 2·4480 + 130 + 65 = 9155;  shared: 4480 + 130 + 65 = 4675
    separate, shared = make(continuous=False), make(continuous=False, shared_trunk=True)
    assert n_params(separate) == 9155
    assert n_params(shared) == 4675
    assert shared.critic_trunk is None and separate.critic_trunk is not None
    # Continuous, 3 action dims: actor head 64·3 + 3 = 195, plus log_std (3,): 2·4480 + 195 + 65 + 3 = 9223
    assert n_params(make(continuous=True)) == 9223


def test_shared_trunk_feeds_both_heads() -> None:
    model, obs = make(continuous=False, shared_trunk=True), observations()
    hidden = model.actor.trunk(obs)
    logits, values = model.heads(obs)
    torch.testing.assert_close(logits, model.actor.head(hidden))
    torch.testing.assert_close(values, model.critic_head(hidden).squeeze(-1))


@pytest.mark.parametrize("shared_trunk", [False, True])
def test_values_alone_are_the_values_of_both_heads_bit_for_bit(shared_trunk: bool) -> None:
    torch.manual_seed(0)
    models = [
        ActorCritic(NetworkSpec(obs_dim=5, action_dim=3, continuous=True, shared_trunk=shared_trunk)) for _ in range(3)
    ]
    net, obs = StackedNetworks(models), torch.randn(3, 40, 5)  # (S, B, obs_dim)
    assert torch.equal(net.values(obs), net.heads(obs)[1])


def test_hidden_sizes_are_used() -> None:
    model = make(continuous=False, hidden_sizes=(32, 16, 8))
    widths = [layer.out_features for layer in model.actor.trunk if isinstance(layer, nn.Linear)]
    assert widths == [32, 16, 8]
    assert model.actor.head.in_features == 8 and model.critic_head.in_features == 8


# --------------------------------------------------------------------------------------------------
# Initialization
# --------------------------------------------------------------------------------------------------


def test_ortho_init_gains_and_zero_biases() -> None:
    model = make(continuous=False)
    # Policy head (2, 64), gain 0.01: orthonormal rows times 0.01, so W Wᵀ = 1e-4 · I and ‖W‖_F = 0.01·√2.
    weight = model.actor.head.weight.detach()
    torch.testing.assert_close(weight @ weight.T, 1e-4 * torch.eye(2), atol=1e-9, rtol=1e-5)
    assert weight.norm().item() == pytest.approx(0.01 * math.sqrt(2.0), rel=1e-5)
    # Value head (1, 64), gain 1: a unit row.
    assert model.critic_head.weight.norm().item() == pytest.approx(1.0, rel=1e-5)
    # First hidden layer (64, 4), gain √2: orthonormal columns times √2, so Wᵀ W = 2 · I.
    first = model.actor.trunk[0].weight.detach()
    torch.testing.assert_close(first.T @ first, 2.0 * torch.eye(OBS_DIM), atol=1e-5, rtol=1e-5)
    for layer in model.modules():
        if isinstance(layer, nn.Linear):
            assert torch.count_nonzero(layer.bias) == 0


def test_ortho_init_gives_near_uniform_initial_policy() -> None:
    # Logits of size ≈ 0.01·‖hidden‖: the initial policy is close to uniform over the 2 actions.
    model = make(continuous=False)
    probs = model.actor(observations()).softmax(-1)
    torch.testing.assert_close(probs, torch.full((B, 2), 0.5), atol=0.05, rtol=0.0)


def test_without_ortho_init_torch_default_is_kept() -> None:
    # torch's default Linear init draws from U(−1/√64, 1/√64): a head far larger than 0.01·√2, nonzero biases.
    model = make(continuous=False, ortho_init=False)
    assert model.actor.head.weight.norm().item() > 0.1
    assert torch.count_nonzero(model.actor.head.bias) > 0


def test_log_std_init() -> None:
    model = make(continuous=True, log_std_init=-2.0)
    assert model.actor.log_std is not None and model.actor.log_std.requires_grad
    assert model.actor.log_std.tolist() == [-2.0, -2.0, -2.0]
    # Entropy per row: 3 · (½ + ½ ln 2π − 2) = 3 · (1.418939 − 2) = −1.743182
    entropy = model.evaluate(observations(), torch.zeros(B, 3)).entropy
    torch.testing.assert_close(entropy, torch.full((B,), 3 * (0.5 + 0.5 * math.log(2 * math.pi) - 2.0)))


@pytest.mark.parametrize("activation, present, absent", [("tanh", nn.Tanh, nn.ReLU), ("relu", nn.ReLU, nn.Tanh)])
def test_activation_choice(activation: str, present: type[nn.Module], absent: type[nn.Module]) -> None:
    model = make(continuous=False, activation=activation)
    for trunk in (model.actor.trunk, model.critic_trunk):
        kinds = [type(layer) for layer in trunk]
        assert kinds == [nn.Linear, present, nn.Linear, present]
        assert absent not in kinds


# --------------------------------------------------------------------------------------------------
# Acting and evaluating
# --------------------------------------------------------------------------------------------------


def test_deterministic_action_is_argmax_of_logits() -> None:
    model, obs = make(continuous=False, ortho_init=False), observations()
    logits = model.actor(obs)
    assert torch.equal(model.deterministic_action(obs), logits.argmax(-1))


def test_deterministic_action_is_gaussian_mean() -> None:
    model, obs = make(continuous=True), observations()
    torch.testing.assert_close(model.deterministic_action(obs), model.heads(obs)[0])


@pytest.mark.parametrize("continuous", [False, True])
def test_act_log_probs_equal_evaluate_log_probs(continuous: bool) -> None:
    model, obs = make(continuous=continuous, ortho_init=False), observations()
    with torch.inference_mode():
        act = model.act(obs)
    evaluation = model.evaluate(obs, act.actions.clone())  # clone(): out of inference mode, as the buffers do
    torch.testing.assert_close(evaluation.log_probs.detach(), act.log_probs)
    torch.testing.assert_close(evaluation.values.detach(), act.values)


def test_evaluate_matches_distribution_functions() -> None:
    model, obs = make(continuous=False, ortho_init=False), observations()
    actions = torch.tensor([0, 1, 1, 0, 1])
    logits, values = model.heads(obs)
    evaluation = model.evaluate(obs, actions)
    # Against torch's own Categorical, not agents.distributions, which evaluate itself calls.
    reference = torch.distributions.Categorical(logits=logits)
    torch.testing.assert_close(evaluation.log_probs, reference.log_prob(actions))
    torch.testing.assert_close(evaluation.entropy, reference.entropy())
    torch.testing.assert_close(evaluation.values, values)


def test_evaluate_has_gradients() -> None:
    model, obs = make(continuous=True), observations()
    evaluation = model.evaluate(obs, torch.zeros(B, 3))
    (evaluation.log_probs.sum() + evaluation.values.sum()).backward()
    assert model.actor.log_std is not None and model.actor.log_std.grad is not None
    assert model.actor.head.weight.grad is not None and model.critic_head.weight.grad is not None


@pytest.mark.parametrize("continuous", [False, True])
def test_same_seed_twice_gives_identical_actions(continuous: bool) -> None:
    def sample(seed: int) -> Tensor:
        model = make(continuous=continuous, seed=seed, ortho_init=False)
        obs = torch.randn(64, OBS_DIM, generator=torch.Generator().manual_seed(1))
        with torch.inference_mode():
            return model.act(obs).actions

    first, second = sample(seed=3), sample(seed=3)
    assert torch.equal(first, second)
    assert not torch.equal(first, sample(seed=4))


def test_clip_grad_norms_scale_a_long_gradient_to_the_limit_and_leave_a_short_one_alone() -> None:
    grad = torch.tensor([[3.0, 4.0], [0.3, 0.4]])  # ‖g‖ = 5, then 0.5 < c = 1: min(1, c / ‖g‖) = 1
    norms = clip_grad_norms_(grad, 1.0)
    torch.testing.assert_close(norms, torch.tensor([5.0, 0.5]))
    scale = 1.0 / (5.0 + 1e-6)  # c / (‖g‖ + 10⁻⁶)
    torch.testing.assert_close(grad, torch.tensor([[3.0 * scale, 4.0 * scale], [0.3, 0.4]]))


def test_the_clip_of_a_stack_of_one_agrees_with_torch_on_the_layers_of_a_network() -> None:
    ours, reference = make(continuous=True, seed=3), make(continuous=True, seed=3)
    net = StackedNetworks([ours])
    obs, actions = observations(), torch.randn(B, 3)
    log_probs, entropy, values = net.evaluate(obs[None], actions[None])
    (100 * (log_probs.sum() + values.pow(2).sum() - entropy.sum())).backward()
    log_probs, entropy, values = reference.evaluate(obs, actions)
    (100 * (log_probs.sum() + values.pow(2).sum() - entropy.sum())).backward()
    expected_norm = nn.utils.clip_grad_norm_(list(reference.parameters()), 0.5)
    norm = clip_grad_norms_(net.flat.grad, 0.5)
    torch.testing.assert_close(norm[0], expected_norm)
    assert expected_norm > 0.5  # it clipped
    torch.testing.assert_close(net.flat.grad[0], torch.cat([p.grad.flatten() for p in reference.parameters()]))


@pytest.mark.parametrize("rows", [B, 1])
@pytest.mark.parametrize("continuous", [False, True])
def test_a_seeds_outputs_and_gradients_do_not_depend_on_how_many_seeds_share_its_stack(
    continuous: bool, rows: int
) -> None:
    # BLAS computes a batch of one matrix-vector product (the critic's head, a one-dimensional action) with
    # another kernel than a batch of several: such layers are computed element-wise, so the bits agree.
    # The guarantee holds at one torch thread, which every run sets (seeding.seed_everything): alone, this test ran
    # at the machine's default thread count, where a 2-core CPU's kernels differ with the batch.
    # One row per seed (one env per seed) is a matrix-vector product, whose rounding depends on where its
    # matrix lies in memory: seed k's row of the stack starts where a stack of one's does (this network has an
    # odd number of parameters, 9,155 or 9,091, so unpadded rows would start at every alignment).
    spec = NetworkSpec(obs_dim=OBS_DIM, action_dim=1 if continuous else 2, continuous=continuous)
    seed_everything(0)
    models = [ActorCritic(spec) for _ in range(3)]
    obs = observations()[:rows]
    actions = torch.randn(rows, 1) if continuous else torch.randint(0, 2, (rows,))
    results = []
    for stack in ([models[1]], models, models[1:]):
        net = StackedNetworks([copy.deepcopy(m) for m in stack])
        k = 1 if len(stack) == 3 else 0
        S = len(stack)
        log_probs, entropy, values = net.evaluate(obs.expand(S, *obs.shape), actions.expand(S, *actions.shape))
        (log_probs.sum() + values.pow(2).sum() - entropy.sum()).backward()
        results.append((log_probs[k].detach(), values[k].detach(), net.flat.grad[k].clone()))
    for other in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(results[0], other, strict=True))


def test_adapt_step_size_by_hand() -> None:
    assert adapt_step_size(1.0, kl=0.004, kl_target=0.01) == 1.5  # below half the target: ×1.5
    assert adapt_step_size(1.0, kl=0.025, kl_target=0.01) == pytest.approx(1 / 1.5)  # above twice: ÷1.5
    assert adapt_step_size(2.0, kl=0.01, kl_target=0.01) == 2.0  # in [target/2, 2·target]: kept
    assert adapt_step_size(1e-3, kl=1.0, kl_target=0.01) == 1e-3 and adapt_step_size(1e3, 0.0, 0.01) == 1e3


def test_refresh_reference_modes() -> None:
    torch.manual_seed(0)
    spec = NetworkSpec(obs_dim=2, action_dim=2, continuous=False)
    policy, reference = Actor(spec), Actor(spec)
    start = [p.detach().clone() for p in reference.parameters()]
    refresh_reference(reference, policy, "never", True, 0.9)
    refresh_reference(reference, policy, "periodic", False, 0.9)
    assert all(torch.equal(p, q) for p, q in zip(reference.parameters(), start, strict=True))
    refresh_reference(reference, policy, "ema", False, 0.75)  # θ_ref ← 0.75 θ_ref + 0.25 θ
    for p, q, r in zip(reference.parameters(), start, policy.parameters(), strict=True):
        torch.testing.assert_close(p, 0.75 * q + 0.25 * r)
    refresh_reference(reference, policy, "periodic", True, 0.75)
    assert all(torch.equal(p, r) for p, r in zip(reference.parameters(), policy.parameters(), strict=True))
