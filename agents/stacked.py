"""S independent networks in one process: their parameters stacked along a leading seed axis.

A small network's gradient step costs mostly per-operation overhead, not arithmetic. Stacking S seeds
makes one batched matmul (``torch.baddbmm``) of S small ones, so S seeds cost far less than S runs.
Nothing is shared but the arithmetic:
- parameters: one (S, P) tensor, row k is seed k's flat parameter vector. Seed k's ordinary
  :class:`~agents.networks.ActorCritic` (PPO) or :class:`~agents.networks.Actor` (GRPO) keeps its
  parameters as views of row k, so evaluation, checkpoints and ``testbed eval`` see an ordinary network;
- Adam (:class:`SeedAdam`): element-wise, with a step count per seed, and a mask for seeds that do not
  step (a seed stopped by its target KL, or failed);
- gradient-norm clipping (:func:`clip_grad_norms_`): one norm per seed;
- random numbers: a ``torch.Generator`` per seed (:class:`SeedGenerators`), which draws what a single
  run draws from the global one.

Every reduction runs within one seed's row, and every shape is fixed by the config alone (or, in GRPO's
chunks, grows only by whole chunks that add exact zeros), so seed k's numbers are bit-identical whoever
its neighbours are.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from agents import distributions as D
from agents.networks import Actor, ActorCritic, Sample

# The stacked views' gradients are strided views of the one (S, P) gradient, by design: backward adds into
# them in place. Autograd warns that such a layout may be slower; measured, the stack is still the fast path.
warnings.filterwarnings("ignore", message="grad and param do not obey the gradient layout contract")


def stack_parameters(models: list[nn.Module]) -> nn.Parameter:
    """One (S, P) parameter whose row k holds ``models[k]``'s parameters, which become views of that row.

    Like :func:`~agents.networks.flatten_parameters` for one model: the optimizer and the clip then handle
    one tensor. Its gradient is preallocated; backward accumulates into it in place.
    """
    rows = [torch.cat([p.detach().reshape(-1) for p in model.parameters()]) for model in models]
    flat = nn.Parameter(torch.stack(rows))  # (S, P)
    flat.grad = torch.zeros_like(flat.data)
    for k, model in enumerate(models):
        offset = 0
        for p in model.parameters():
            p.data = flat.data[k, offset : offset + p.numel()].view_as(p)
            offset += p.numel()
    return flat


def stacked_views(flat: nn.Parameter, model: nn.Module) -> dict[str, nn.Parameter]:
    """Each of ``model``'s parameters across all S seeds, (S, *shape), as leaves whose data and gradients
    are views of ``flat`` and ``flat.grad``."""
    S, views, offset = flat.shape[0], {}, 0
    for name, p in model.named_parameters():
        region = slice(offset, offset + p.numel())
        view = nn.Parameter(flat.data[:, region].view(S, *p.shape))
        view.grad = flat.grad[:, region].view(S, *p.shape)
        views[name], offset = view, offset + p.numel()
    return views


def linear(x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """y_k = x_k W_kᵀ + b_k for every seed k at once.  x (S, B, in), W (S, out, in), b (S, out) → (S, B, out)."""
    return torch.baddbmm(bias.unsqueeze(1), x, weight.transpose(1, 2))


class StackedNetworks:
    """S networks of one spec, computed together: :class:`~agents.networks.ActorCritic` networks (PPO), or
    :class:`~agents.networks.Actor` networks (GRPO's policies and references), which have no critic.

    Observations are (S, B, obs_dim); every output has the seed axis first.
    """

    def __init__(self, models: list[ActorCritic] | list[Actor]) -> None:
        self.spec = models[0].spec
        self.flat = stack_parameters(models)  # (S, P)
        p = stacked_views(self.flat, models[0])
        depth = len(self.spec.hidden_sizes)
        actor = "actor." if isinstance(models[0], ActorCritic) else ""
        self.actor_trunk = [(p[f"{actor}trunk.{2 * i}.weight"], p[f"{actor}trunk.{2 * i}.bias"]) for i in range(depth)]
        self.actor_head = (p[f"{actor}head.weight"], p[f"{actor}head.bias"])
        self.log_std = p.get(f"{actor}log_std")  # (S, D) for continuous actions
        self.critic_trunk = None if not actor or self.spec.shared_trunk else [
            (p[f"critic_trunk.{2 * i}.weight"], p[f"critic_trunk.{2 * i}.bias"]) for i in range(depth)]  # fmt: skip
        self.critic_head = (p["critic_head.weight"], p["critic_head.bias"]) if actor else None
        self.activation = torch.tanh if self.spec.activation == "tanh" else torch.relu

    @property
    def seeds(self) -> int:
        return self.flat.shape[0]

    def _trunk(self, x: Tensor, layers: list[tuple[Tensor, Tensor]]) -> Tensor:
        for weight, bias in layers:
            x = self.activation(linear(x, weight, bias))
        return x

    def policy(self, obs: Tensor) -> Tensor:
        """Policy head output (logits or means), (S, B, action_dim)."""
        return linear(self._trunk(obs, self.actor_trunk), *self.actor_head)

    def heads(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        """Policy head output (S, B, action_dim) and values (S, B), as ``ActorCritic.heads`` per seed."""
        assert self.critic_head is not None, "heads: these networks have no critic"
        hidden = self._trunk(obs, self.actor_trunk)
        critic_hidden = hidden if self.critic_trunk is None else self._trunk(obs, self.critic_trunk)
        return linear(hidden, *self.actor_head), linear(critic_hidden, *self.critic_head).squeeze(-1)

    def sample_seed(self, k: int, out: Tensor, generator: torch.Generator) -> Sample:
        """a ~ π_k(·|s) and log π_k(a|s) for seed k's head output ``out`` (B, action_dim), drawn from its own
        generator exactly as ``Actor.sample`` draws from the global one."""
        if self.log_std is None:
            actions = torch.multinomial(out.softmax(-1), 1, generator=generator).squeeze(-1)  # (B,)
            return Sample(actions, D.categorical_log_prob(out, actions))
        actions = out + torch.exp(self.log_std[k]) * torch.randn(out.shape, generator=generator, device=out.device)
        return Sample(actions, D.gaussian_log_prob(out, self.log_std[k], actions))

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


def clip_grad_norms_(grad: Tensor, max_norm: float) -> Tensor:
    """Global gradient-norm clipping per seed, in place on the stacked gradient (S, P)::

        g_k ← g_k · min(1, c / (‖g_k‖₂ + 10⁻⁶))

    g_k is row k, seed k's whole gradient; c is ``max_norm``. Each seed is clipped by its own norm, as
    :func:`~agents.networks.clip_grad_norm_` clips a single run. Returns the norms before clipping, (S,).
    """
    norms = torch.linalg.vector_norm(grad, dim=1)  # (S,)
    grad.mul_(torch.clamp(max_norm / (norms + 1e-6), max=1.0).unsqueeze(1))
    return norms


def masked_mean(x: Tensor, mask: Tensor, count: Tensor | None = None) -> Tensor:
    """Mean of each row over its masked entries: Σ_j m_j x_j / max(Σ_j m_j, 1).  x, mask (S, B) → (S,).
    Entries outside the mask never enter the sum, so a NaN there stays out of it. ``count``: the
    denominators, (S,), when the caller already has them."""
    return torch.where(mask, x, 0.0).sum(-1) / (mask.sum(-1).clamp(min=1) if count is None else count)


class SeedAdam:
    """Adam (Kingma & Ba 2015) on each row of an (S, P) stack, with its own step count t_k and learning
    rate α_k, as ``torch.optim.Adam`` computes it for a single run::

        t ← t + 1,   m ← β₁ m + (1 − β₁) g,   v ← β₂ v + (1 − β₂) g²
        θ ← θ − α / (1 − β₁ᵗ) · m / (√v / √(1 − β₂ᵗ) + ε)

    A row outside ``stepping`` keeps θ, m, v and t as they are.
    """

    def __init__(self, flat: nn.Parameter, lr: float, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-5) -> None:  # fmt: skip
        self.flat, (self.beta1, self.beta2), self.eps = flat, betas, eps
        self.exp_avg = torch.zeros_like(flat.data)  # (S, P)  m
        self.exp_avg_sq = torch.zeros_like(flat.data)  # (S, P)  v
        self.steps = torch.zeros(flat.shape[0], dtype=torch.float64)  # (S,)  t
        self.lr = torch.full((flat.shape[0],), lr, dtype=torch.float64)  # (S,)  α

    def step(self, stepping: Tensor) -> None:
        """One step for the rows where ``stepping`` (S,) bool is True."""
        grad, rows = self.flat.grad, stepping.cpu()
        steps = self.steps + rows
        step_size = (self.lr / (1 - self.beta1**steps)).to(grad).unsqueeze(1)  # (S, 1)
        bias_correction2_sqrt = torch.sqrt(1 - self.beta2**steps).to(grad).unsqueeze(1)  # (S, 1)
        # Every row takes the same in-place operations, and a row that does not step is put back afterwards:
        # a stepping row's numbers never depend on which other rows step.
        held = (~rows).nonzero().squeeze(1).to(grad.device)
        kept = [t[held].clone() for t in (self.exp_avg, self.exp_avg_sq, self.flat.data)] if len(held) else []
        self.exp_avg.lerp_(grad, 1 - self.beta1)
        self.exp_avg_sq.mul_(self.beta2).addcmul_(grad, grad, value=1 - self.beta2)
        denom = self.exp_avg_sq.sqrt().div_(bias_correction2_sqrt).add_(self.eps)
        self.flat.data.sub_(self.exp_avg.mul(step_size).div_(denom))
        for tensor, old in zip((self.exp_avg, self.exp_avg_sq, self.flat.data), kept):
            tensor[held] = old
        self.steps = steps


class LaneAdam:
    """Row k of a :class:`SeedAdam`, as the ``torch.optim.Adam`` of a single run looks: its learning rate
    (``param_groups``), its ``state``, and the state dict that a single run's checkpoint holds, so that
    seed k's run directory resumes as a single run too."""

    def __init__(self, adam: SeedAdam, k: int) -> None:
        self.adam, self.k = adam, k
        template = torch.optim.Adam([torch.zeros(1, requires_grad=True)], lr=float(adam.lr[k]), eps=adam.eps,
                                    fused=True)  # fmt: skip
        self.param_groups: list[dict[str, Any]] = template.state_dict()["param_groups"]

    @property
    def state(self) -> dict[int, dict[str, Tensor]]:
        adam, k = self.adam, self.k
        if adam.steps[k] == 0:
            return {}
        return {0: {"step": torch.tensor(float(adam.steps[k])), "exp_avg": adam.exp_avg[k],
                    "exp_avg_sq": adam.exp_avg_sq[k]}}  # fmt: skip

    def state_dict(self) -> dict[str, Any]:
        return {"state": {i: {name: t.clone() for name, t in s.items()} for i, s in self.state.items()},
                "param_groups": [dict(group) for group in self.param_groups]}  # fmt: skip

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        adam, k = self.adam, self.k
        self.param_groups[0].update({key: v for key, v in state_dict["param_groups"][0].items() if key != "params"})
        state = state_dict["state"].get(0)
        adam.exp_avg[k] = state["exp_avg"] if state else 0.0
        adam.exp_avg_sq[k] = state["exp_avg_sq"] if state else 0.0
        adam.steps[k] = float(state["step"]) if state else 0.0


def fixed_minibatch_slots(count: int, minibatches: int, width: int) -> Tensor:
    """Where each of ``count`` shuffled samples goes when split into ``minibatches`` near-equal parts, as
    ``Tensor.tensor_split`` splits them (the first count mod M parts one longer), each part padded to
    ``width``: position m · width + s for slot s of part m.  → (count,) int64."""
    q, r = divmod(count, minibatches)
    j = torch.arange(count)
    long_parts = r * (q + 1)  # samples in the first r parts, of q + 1 each
    part = torch.where(j < long_parts, j // (q + 1), r + (j - long_parts) // max(q, 1))
    start = torch.where(part < r, part * (q + 1), long_parts + (part - r) * q)
    return part * width + (j - start)


def padded_width(samples: int, minibatches: int) -> int:
    """The longest a minibatch can be, ⌈samples / M⌉: the padded width every seed shares."""
    return math.ceil(samples / minibatches)


class SeedGenerators:
    """Each seed's random number generators in a stack: a ``torch.Generator``, which draws what a single run
    draws from the global one, and what a single run's checkpoint records of NumPy's global generator."""

    def __init__(self) -> None:
        self.torch: list[torch.Generator] = []
        self.numpy: list[dict[str, Any]] = []

    def capture(self, device: str) -> None:
        """Add a seed whose generators continue from the global state, right after its single run's build."""
        generator = torch.Generator(device)
        generator.set_state(torch.get_rng_state() if device == "cpu" else torch.cuda.get_rng_state())
        self.torch.append(generator)
        self.numpy.append(np.random.get_state(legacy=False))

    def state(self, k: int) -> dict[str, Any]:
        """Seed k's generators as a single run's checkpoint records them."""
        return {"torch": self.torch[k].get_state(), "numpy": self.numpy[k]}

    def load(self, k: int, state: dict[str, Any]) -> None:
        self.torch[k].set_state(state["torch"])
        self.numpy[k] = state["numpy"]
