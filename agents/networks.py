"""Actor and critic MLPs for discrete (Categorical) and continuous (diagonal Gaussian) actions.

One module holds both heads so that acting takes a single call for the action, its log-probability and
the value. Separate actor and critic trunks are the default; ``shared_trunk`` feeds both heads from one.
"""

from __future__ import annotations

import math
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


def flatten_parameters(model: nn.Module) -> nn.Parameter:
    """Make every parameter (and its gradient) a view into one flat tensor, and return that tensor.

    The optimizer and the gradient-norm clip then handle one tensor instead of one per layer, which
    removes most of their per-step Python overhead. Backward accumulates into the gradient views in
    place, so zero the gradient with ``flat.grad.zero_()`` rather than setting it to None. Call after
    moving the model to its device.
    """
    params = list(model.parameters())
    flat_data = torch.cat([p.detach().reshape(-1) for p in params])  # (P,)
    flat = nn.Parameter(flat_data)
    flat.grad = torch.zeros_like(flat_data)
    offset = 0
    for p in params:
        n = p.numel()
        p.data = flat.data[offset : offset + n].view_as(p)
        p.grad = flat.grad[offset : offset + n].view_as(p)
        offset += n
    return flat


def clip_grad_norm_(flat: nn.Parameter, max_norm: float) -> Tensor:
    """Global gradient-norm clipping (PPO implementation detail 11), in place on the flat gradient::

        g ← g · min(1, c / (‖g‖₂ + 10⁻⁶))

    g is the gradient of every parameter as one vector (``flat.grad``, see :func:`flatten_parameters`), c
    the largest norm allowed (``max_norm``); the 10⁻⁶ guards against ‖g‖₂ = 0. This is the formula of
    ``torch.nn.utils.clip_grad_norm_``, which first groups many tensors by device and dtype: on one flat
    tensor that bookkeeping costs several times the arithmetic, at every one of PPO's thousands of small
    gradient steps. Returns ‖g‖₂ before clipping, as a tensor, so that nothing waits for its value.
    """
    norm = torch.linalg.vector_norm(flat.grad)
    flat.grad.mul_(torch.clamp(max_norm / (norm + 1e-6), max=1.0))
    return norm


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
        """Logits or means, (B, action_dim)."""
        return self.head(self.trunk(obs))

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
        out = self(obs)
        return out.argmax(-1) if self.log_std is None else out


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
        """Policy head output (logits or means, (B, action_dim)) and values (B,), in one pass."""
        hidden = self.actor.trunk(obs)
        critic_hidden = hidden if self.critic_trunk is None else self.critic_trunk(obs)
        return self.actor.head(hidden), self.critic_head(critic_hidden).squeeze(-1)

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


def adam(model: nn.Module, learning_rate: float) -> torch.optim.Adam:
    """Adam with ε = 1e-5 (PPO implementation detail 3) over the model's parameters as one flat tensor."""
    flat_params = flatten_parameters(model)  # one tensor for Adam and the gradient clip: less overhead
    return torch.optim.Adam([flat_params], lr=learning_rate, eps=1e-5, fused=True)


def gradient_step(optimizer: torch.optim.Optimizer, loss: Tensor, max_grad_norm: float) -> None:
    """One step of an optimizer made by :func:`adam`: gradient of ``loss``, global norm clip, update."""
    (flat_params,) = optimizer.param_groups[0]["params"]
    flat_params.grad.zero_()
    loss.backward()
    clip_grad_norm_(flat_params, max_grad_norm)
    optimizer.step()


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
