"""Actor and critic MLPs for discrete (Categorical) and continuous (diagonal Gaussian) actions, computed for
S seeds at once.

One module holds both heads so that acting takes a single call for the action, its log-probability and
the value. Separate actor and critic trunks are the default; ``shared_trunk`` feeds both heads from one.

One forward pass for every use: the layers take a leading seed axis (:func:`linear`, :class:`Layers`).
:class:`StackedNetworks` computes S seeds' networks together, their parameters stacked along that axis;
a single :class:`Actor` or :class:`ActorCritic` (evaluation, ``testbed eval``, a checkpoint's weights) is a
stack of one. A small network's step costs mostly per-operation overhead, so S seeds in one batched
matmul cost far less than S runs; and seed k's numbers are bit-identical whatever S is (tested), because
every reduction runs within one seed's row, a layer of width one avoids the one BLAS path that
computes a batch of one otherwise than a batch of several, and each seed's parameters start at the same
alignment as a stack of one's (a matrix-vector product rounds by its matrix's address).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple, TypeVar

import torch
from torch import Tensor, nn

from agents import distributions as D
from envs.errors import BadInput

ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU}
M = TypeVar("M", bound=nn.Module)


@dataclass(frozen=True)
class NetworkSpec:
    """The shape of the actor-critic."""

    obs_dim: int
    action_dim: int
    """Number of actions (discrete) or action dimensions (continuous)."""
    continuous: bool
    hidden_sizes: tuple[int, ...] = (64, 64)
    activation: str = "tanh"
    shared_trunk: bool = False
    ortho_init: bool = True
    log_std_init: float = 0.0


class Sample(NamedTuple):
    actions: Tensor  # (N,) int64 or (N, D)
    log_probs: Tensor  # (N,)


class Act(NamedTuple):
    actions: Tensor  # (N,) int64 or (N, D)
    log_probs: Tensor  # (N,)
    values: Tensor  # (N,)


class Evaluation(NamedTuple):
    log_probs: Tensor  # (B,)
    entropy: Tensor  # (B,)
    values: Tensor  # (B,)


def linear(x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """y_k = x_k W_kᵀ + b_k for every seed k at once.  x (S, B, in), W (S, out, in), b (S, out) → (S, B, out).

    A batched matmul; a layer with one input or one output unit is written element-wise instead, because
    BLAS computes a batch of one matrix-vector product with another kernel than a batch of several, which
    would make seed k's numbers depend on how many seeds share its stack.
    """
    if weight.shape[1] == 1 or weight.shape[2] == 1:
        return (x.unsqueeze(-2) * weight.unsqueeze(1)).sum(-1) + bias.unsqueeze(1)
    return torch.baddbmm(bias.unsqueeze(1), x, weight.transpose(1, 2))


@dataclass(frozen=True)
class Layers:
    """A network's linear layers as (weight, bias) pairs with a leading seed axis, and its log σ: the one
    place its forward pass is written. Observations are (S, B, obs_dim); outputs have the seed axis first."""

    actor_trunk: list[tuple[Tensor, Tensor]]
    actor_head: tuple[Tensor, Tensor]
    log_std: Tensor | None  # (S, D) for continuous actions
    critic_trunk: list[tuple[Tensor, Tensor]] | None  # None: the critic reads the actor's trunk (or there is none)
    critic_head: tuple[Tensor, Tensor] | None  # None: no critic (GRPO's Actor)
    activation: str

    def trunk(self, x: Tensor, layers: list[tuple[Tensor, Tensor]]) -> Tensor:
        act = torch.tanh if self.activation == "tanh" else torch.relu
        for weight, bias in layers:
            x = act(linear(x, weight, bias))
        return x

    def policy(self, obs: Tensor) -> Tensor:
        """Policy head output (logits or means), (S, B, action_dim)."""
        return linear(self.trunk(obs, self.actor_trunk), *self.actor_head)

    def deterministic_action(self, obs: Tensor) -> Tensor:
        """The mode of π(·|s): argmax of the logits (S, B), or the Gaussian means (S, B, action_dim)."""
        out = self.policy(obs)
        return out.argmax(-1) if self.log_std is None else out

    def heads(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        """Policy head output (S, B, action_dim) and values V(s) (S, B), in one pass."""
        assert self.critic_head is not None, "heads: this network has no critic"
        hidden = self.trunk(obs, self.actor_trunk)
        critic_hidden = hidden if self.critic_trunk is None else self.trunk(obs, self.critic_trunk)
        return linear(hidden, *self.actor_head), linear(critic_hidden, *self.critic_head).squeeze(-1)

    def values(self, obs: Tensor) -> Tensor:
        """V(s) (S, B) alone, as :meth:`heads` computes it: a separate critic skips the actor's layers."""
        if self.critic_trunk is None:
            return self.heads(obs)[1]
        assert self.critic_head is not None, "values: this network has no critic"
        return linear(self.trunk(obs, self.critic_trunk), *self.critic_head).squeeze(-1)


def layers_of(model: Actor | ActorCritic, stacked: Callable[[nn.Parameter], Tensor]) -> Layers:
    """``model``'s layers, each parameter given its seed axis by ``stacked``: a single model's own parameters
    as a stack of one, or the rows of S models' stacked parameters (:class:`StackedNetworks`)."""
    actor = actor_of(model)

    def pairs(layers: nn.Sequential) -> list[tuple[Tensor, Tensor]]:
        return [(stacked(layer.weight), stacked(layer.bias)) for layer in layers if isinstance(layer, nn.Linear)]

    critic = isinstance(model, ActorCritic)
    return Layers(
        actor_trunk=pairs(actor.trunk),
        actor_head=(stacked(actor.head.weight), stacked(actor.head.bias)),
        log_std=None if actor.log_std is None else stacked(actor.log_std),
        critic_trunk=pairs(model.critic_trunk) if critic and model.critic_trunk is not None else None,
        critic_head=(stacked(model.critic_head.weight), stacked(model.critic_head.bias)) if critic else None,
        activation=model.spec.activation,
    )


def one_seed(parameter: nn.Parameter) -> Tensor:
    return parameter.unsqueeze(0)


def stack_layers(models: list[Actor] | list[ActorCritic]) -> Layers:
    """S separate models of one spec as one stack: each parameter copied into an (S, *shape) tensor, row k
    ``models[k]``'s. A copy, not views, so that it serves models wherever their parameters live (a stack's
    rows, or a module of their own); seed k computes in it as it does alone (:func:`linear`)."""
    names = {id(p): name for name, p in models[0].named_parameters()}
    parameters = [dict(model.named_parameters()) for model in models]
    return layers_of(models[0], lambda p: torch.stack([own[names[id(p)]].detach() for own in parameters]))


def mlp(in_dim: int, hidden_sizes: tuple[int, ...], activation: str) -> nn.Sequential:
    layers: list[nn.Module] = []
    for size in hidden_sizes:
        layers += [nn.Linear(in_dim, size), ACTIVATIONS[activation]()]
        in_dim = size
    return nn.Sequential(*layers)


def orthogonal_init(layer: nn.Module, gain: float) -> None:
    """Orthogonal weights with the given gain and zero biases (PPO implementation detail 2)."""
    if isinstance(layer, nn.Linear):
        nn.init.orthogonal_(layer.weight, gain)
        nn.init.zeros_(layer.bias)


class Actor(nn.Module):
    """π_θ(a|s): an MLP trunk and a head giving logits (discrete) or means (continuous, with a
    state-independent log σ). GRPO uses it alone; PPO's ActorCritic adds a critic beside it."""

    def __init__(self, spec: NetworkSpec) -> None:
        super().__init__()
        self.spec = spec
        width = spec.hidden_sizes[-1] if spec.hidden_sizes else spec.obs_dim
        self.trunk = mlp(spec.obs_dim, spec.hidden_sizes, spec.activation)
        self.head = nn.Linear(width, spec.action_dim)
        self.log_std = nn.Parameter(torch.full((spec.action_dim,), spec.log_std_init)) if spec.continuous else None
        if spec.ortho_init:
            # Gains of the PPO baselines: √2 for hidden layers, 0.01 for the policy head (a near-uniform
            # initial policy).
            self.trunk.apply(lambda layer: orthogonal_init(layer, math.sqrt(2)))
            orthogonal_init(self.head, 0.01)

    def forward(self, obs: Tensor) -> Tensor:
        """Logits or means, (B, action_dim): the stacked forward pass, for a stack of one."""
        return layers_of(self, one_seed).policy(obs.unsqueeze(0)).squeeze(0)

    def sample(self, out: Tensor) -> Sample:
        """a ~ π(·|s) and log π(a|s), from the head output ``out``."""
        if self.log_std is None:
            actions = D.categorical_sample(out)
            return Sample(actions, D.categorical_log_prob(out, actions))
        actions = D.gaussian_sample(out, self.log_std)
        return Sample(actions, D.gaussian_log_prob(out, self.log_std, actions))

    def log_prob_entropy(self, out: Tensor, actions: Tensor) -> tuple[Tensor, Tensor]:
        """log π(a|s) of stored actions and the entropy of π(·|s), from the head output ``out``."""
        if self.log_std is None:
            return D.categorical_log_prob_entropy(out, actions)
        return D.gaussian_log_prob(out, self.log_std, actions), D.gaussian_entropy(self.log_std, out.shape[0])

    def act(self, obs: Tensor) -> Sample:
        """Sample actions with their log-probabilities. Call under ``torch.inference_mode()``."""
        return self.sample(self(obs))

    def deterministic_action(self, obs: Tensor) -> Tensor:
        """The mode of π(·|s): argmax of the logits, or the Gaussian mean."""
        return layers_of(self, one_seed).deterministic_action(obs.unsqueeze(0)).squeeze(0)


class ActorCritic(nn.Module):
    """π_θ(a|s) and V_φ(s), with separate trunks by default.  Observations are (B, obs_dim) float32."""

    def __init__(self, spec: NetworkSpec) -> None:
        super().__init__()
        self.spec = spec
        width = spec.hidden_sizes[-1] if spec.hidden_sizes else spec.obs_dim
        self.actor = Actor(spec)
        self.critic_trunk = None if spec.shared_trunk else mlp(spec.obs_dim, spec.hidden_sizes, spec.activation)
        self.critic_head = nn.Linear(width, 1)
        if spec.ortho_init:
            if self.critic_trunk is not None:
                self.critic_trunk.apply(lambda layer: orthogonal_init(layer, math.sqrt(2)))
            orthogonal_init(self.critic_head, 1.0)

    def heads(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        """Policy head output (logits or means, (B, action_dim)) and values (B,), in one pass: the stacked
        forward pass, for a stack of one."""
        out, values = layers_of(self, one_seed).heads(obs.unsqueeze(0))
        return out.squeeze(0), values.squeeze(0)

    def value(self, obs: Tensor) -> Tensor:
        return self.heads(obs)[1]

    def act(self, obs: Tensor) -> Act:
        """Sample a ~ π(·|s) with its log-probability and V(s). Call under ``torch.inference_mode()``."""
        out, values = self.heads(obs)
        actions, log_probs = self.actor.sample(out)
        return Act(actions, log_probs, values)

    def evaluate(self, obs: Tensor, actions: Tensor) -> Evaluation:
        """log π(a|s), the entropy of π(·|s) and V(s) for stored actions, with gradients."""
        out, values = self.heads(obs)
        return Evaluation(*self.actor.log_prob_entropy(out, actions), values)

    def deterministic_action(self, obs: Tensor) -> Tensor:
        return self.actor.deterministic_action(obs)


def actor_of(model: Actor | ActorCritic) -> Actor:
    """The policy of a model: an ActorCritic's actor, or the Actor itself (GRPO's, which has no critic)."""
    return model.actor if isinstance(model, ActorCritic) else model


# The stacked views' gradients are strided views of the one (S, P) gradient, by design: backward adds into
# them in place. Autograd warns that such a layout may be slower; measured, the stack is still the fast path.
# Ignored where the backward runs (optimizers.SeedOptimizer.gradient_step): a filter set at import is lost when
# the import happens inside a caller's ``warnings.catch_warnings()``, as the command line's planning does.
LAYOUT_WARNING = "grad and param do not obey the gradient layout contract"


ROW_ALIGNMENT = 16
"""Elements (64 bytes of float32) between the starts of two seeds' rows of stacked parameters."""


def stack_parameters(models: list[nn.Module]) -> nn.Parameter:
    """One (S, P) parameter whose row k holds ``models[k]``'s parameters, which become views of that row;
    the rows lie ``ROW_ALIGNMENT``-padded apart in memory.

    The optimizer and the gradient clip then handle one tensor. Its gradient is preallocated; backward
    accumulates into it in place.
    """
    rows = [torch.cat([p.detach().reshape(-1) for p in model.parameters()]) for model in models]
    S, P = len(rows), rows[0].numel()
    # Row k starts at a multiple of ROW_ALIGNMENT elements, as a stack of one's row does: BLAS's
    # matrix-vector product (a layer applied to one observation) rounds by where its matrix lies in memory.
    stride = -(-P // ROW_ALIGNMENT) * ROW_ALIGNMENT
    like = {"dtype": rows[0].dtype, "device": rows[0].device}
    flat = nn.Parameter(torch.zeros(S, stride, **like)[:, :P].copy_(torch.stack(rows)))  # (S, P), rows `stride` apart
    flat.grad = torch.zeros(S, stride, **like)[:, :P]
    for k, model in enumerate(models):
        offset = 0
        for p in model.parameters():
            p.data = flat.data[k, offset : offset + p.numel()].view_as(p)
            offset += p.numel()
    return flat


def stacked_views(flat: nn.Parameter, model: nn.Module) -> dict[int, nn.Parameter]:
    """Each of ``model``'s parameters across all S seeds, (S, *shape), by the id of ``model``'s own: leaves
    whose data and gradients are views of ``flat`` and ``flat.grad``."""
    S, views, offset = flat.shape[0], {}, 0
    for p in model.parameters():
        region = slice(offset, offset + p.numel())
        view = nn.Parameter(flat.data[:, region].view(S, *p.shape))
        view.grad = flat.grad[:, region].view(S, *p.shape)
        views[id(p)], offset = view, offset + p.numel()
    return views


class StackedNetworks:
    """S networks of one spec, computed together: :class:`ActorCritic` networks (PPO), or :class:`Actor`
    networks (GRPO's policies and references), which have no critic.

    Their parameters are one (S, P) tensor (``flat``), row k seed k's. Seed k's own module keeps its
    parameters as views of row k, so evaluation, checkpoints and ``testbed eval`` see an ordinary network.
    Observations are (S, B, obs_dim); every output has the seed axis first.
    """

    def __init__(self, models: list[ActorCritic] | list[Actor]) -> None:
        self.spec = models[0].spec
        self.flat = stack_parameters(models)  # (S, P)
        views = stacked_views(self.flat, models[0])
        self.layers = layers_of(models[0], lambda p: views[id(p)])

    @property
    def seeds(self) -> int:
        return self.flat.shape[0]

    @property
    def log_std(self) -> Tensor | None:
        return self.layers.log_std

    def policy(self, obs: Tensor) -> Tensor:
        return self.layers.policy(obs)

    def heads(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        return self.layers.heads(obs)

    def values(self, obs: Tensor) -> Tensor:
        return self.layers.values(obs)

    def sample_seed(self, k: int, out: Tensor, generator: torch.Generator) -> Sample:
        """a ~ π_k(·|s) and log π_k(a|s) for seed k's head output ``out`` (B, action_dim), drawn from its own
        generator exactly as ``Actor.sample`` draws from the global one."""
        if self.log_std is None:
            actions = torch.multinomial(out.softmax(-1), 1, generator=generator).squeeze(-1)  # (B,)
            return Sample(actions, D.categorical_log_prob(out, actions))
        actions = out + torch.exp(self.log_std[k]) * torch.randn(out.shape, generator=generator, device=out.device)
        return Sample(actions, D.gaussian_log_prob(out, self.log_std[k], actions))

    def seed_policy(self, k: int, model: Actor, generator: torch.Generator) -> Callable[[Tensor], Sample]:
        """Seed k's π_θ acting on its own, outside the stack's batched steps (GRPO's trunks and vine
        branches): its own module, which computes as its row of the stack, and its own generator."""
        device = self.flat.device

        def act(obs: Tensor) -> Sample:
            return self.sample_seed(k, model(obs.to(device)), generator)

        return act

    def sample(self, out: Tensor, generators: list[torch.Generator | None]) -> tuple[Tensor, Tensor]:
        """a ~ π_k(·|s) and log π_k(a|s) for each seed k, out (S, N, action_dim), drawn from its own generator
        as a single run draws from the global one; a seed whose generator is None (not running) gets zeros
        and draws nothing. The log-probabilities are one batched call for all seeds."""
        if self.log_std is None:
            probs = out.softmax(-1)  # (S, N, K)
            actions = torch.zeros(out.shape[:2], dtype=torch.int64, device=out.device)  # (S, N)
            for k, generator in enumerate(generators):
                if generator is not None:
                    actions[k] = torch.multinomial(probs[k], 1, generator=generator).squeeze(-1)
            return actions, D.categorical_log_prob(out, actions)
        noise = torch.zeros_like(out)  # (S, N, D)
        for k, generator in enumerate(generators):
            if generator is not None:
                noise[k] = torch.randn(out.shape[1:], generator=generator, device=out.device)
        log_std = self.log_std.unsqueeze(1)  # (S, 1, D)
        actions = out + torch.exp(log_std) * noise
        return actions, D.gaussian_log_prob(out, log_std, actions)

    def log_prob_entropy(self, out: Tensor, actions: Tensor) -> tuple[Tensor, Tensor]:
        """log π(a|s) of stored actions and the entropy of π(·|s), each (S, B), with gradients."""
        if self.log_std is None:
            return D.categorical_log_prob_entropy(out, actions)
        entropy = torch.stack([D.gaussian_entropy(log_std, out.shape[1]) for log_std in self.log_std])  # (S, B)
        return D.gaussian_log_prob(out, self.log_std.unsqueeze(1), actions), entropy

    def evaluate(self, obs: Tensor, actions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """log π(a|s), the entropy of π(·|s) and V(s) for stored actions, each (S, B), with gradients."""
        out, values = self.heads(obs)
        return *self.log_prob_entropy(out, actions), values


def adapt_step_size(scale: float, kl: float, kl_target: float) -> float:
    """The step-size factor after an update whose KL(π_old ‖ π_new) was ``kl`` (Schulman et al. 2017's
    adaptive KL rule, applied to the learning rate as in legged-robot PPO):

        scale ← scale · 1.5   if KL < KL_target / 2
        scale ← scale / 1.5   if KL > 2 · KL_target
        scale                 otherwise,                 kept in [10⁻³, 10³]
    """
    if kl > 2.0 * kl_target:
        return max(scale / 1.5, 1e-3)
    if kl < kl_target / 2.0:
        return min(scale * 1.5, 1e3)
    return scale


def refresh_reference(reference: nn.Module, policy: nn.Module, mode: str, due: bool, ema: float) -> None:
    """Move a reference policy toward the trained one: ``periodic`` copies it when ``due``; ``ema`` sets
    θ_ref ← ema · θ_ref + (1 − ema) · θ; ``never`` keeps it."""
    if mode == "periodic" and due:
        reference.load_state_dict(policy.state_dict())
    elif mode == "ema":
        with torch.no_grad():
            for ref_p, p in zip(reference.parameters(), policy.parameters(), strict=True):
                ref_p.lerp_(p, 1.0 - ema)


def load_weights(model: M, weights: dict[str, Tensor], source: str) -> M:
    """Load a checkpoint's weights into ``model``; a network of another shape is bad input, not a crash."""
    try:
        model.load_state_dict(weights)
    except RuntimeError as error:
        detail = str(error).splitlines()[1].strip() if "\n" in str(error) else str(error)
        raise BadInput(
            f"{source} holds weights for another network than the run's config.yaml describes ({detail}). "
            "Restore config.yaml's network settings (hidden_sizes, activation, shared_trunk) to those the "
            "run was trained with."
        ) from None
    return model
