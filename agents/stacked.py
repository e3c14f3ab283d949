"""What each seed of a stack keeps its own, with a leading seed axis: the gradient clip, the minibatches and
the random number generators. A single run is a stack of one.

- parameters: one (S, P) tensor, row k seed k's (``networks.StackedNetworks``);
- the optimizer: a torch optimizer per seed over its row (``optimizers.SeedOptimizer``), and a mask for
  seeds that do not step (a seed stopped by its target KL, or failed);
- gradient-norm clipping (:func:`clip_grad_norms_`): one norm per seed;
- minibatches (:class:`Minibatches`): each seed's own samples, shuffled by its own generator and padded to
  a width the config fixes;
- random numbers: a ``torch.Generator`` per seed (:class:`SeedGenerators`).

Every reduction runs within one seed's row, and every shape is fixed by the config alone, so seed k's
numbers are bit-identical whoever its neighbours are, and however many.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import Tensor

from agents.networks import StackedNetworks


def clip_grad_norms_(grad: Tensor, max_norm: float) -> Tensor:
    """Global gradient-norm clipping per seed, in place on the stacked gradient (S, P)::

        g_k ← g_k · min(1, c / (‖g_k‖₂ + 10⁻⁶))

    g_k is row k, seed k's whole gradient; c is ``max_norm``. Each seed is clipped by its own norm, as
    ``torch.nn.utils.clip_grad_norm_`` clips a single model. Returns the norms before clipping, (S,).
    """
    norms = torch.linalg.vector_norm(grad, dim=1)  # (S,)
    grad.mul_(torch.clamp(max_norm / (norms + 1e-6), max=1.0).unsqueeze(1))
    return norms


def masked_mean(x: Tensor, mask: Tensor, count: Tensor | None = None) -> Tensor:
    """Mean of each row over its masked entries: Σ_j m_j x_j / max(Σ_j m_j, 1).  x, mask (S, B) → (S,).
    Entries outside the mask never enter the sum, so a NaN there stays out of it. ``count``: the
    denominators, (S,), when the caller already has them."""
    return torch.where(mask, x, 0.0).sum(-1) / (mask.sum(-1).clamp(min=1) if count is None else count)


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


def by_seed(x: Tensor, seeds: int) -> Tensor:
    """An iteration's (T, S·N, …) columns, seed k's N envs side by side, as (S, T·N, …): seed k's samples in
    the order one seed's (T, N) batch flattens."""
    x = x.reshape(x.shape[0], seeds, -1, *x.shape[2:]).transpose(0, 1)  # (S, T, N, …)
    return x.reshape(seeds, -1, *x.shape[3:])


class Minibatches:
    """Each seed's valid samples, shuffled by its own generator every epoch and split into M near-equal
    minibatches as ``Tensor.tensor_split`` splits them, each padded to the width W = ⌈T·N / M⌉ that every
    seed shares (``mask`` False on the padding). ``valid`` (S, T·N): the samples to train on."""

    def __init__(self, valid: Tensor, minibatches: int, random: SeedGenerators) -> None:
        S, samples = valid.shape
        self.M, self.W, self.random = minibatches, padded_width(samples, minibatches), random
        indices = [row.nonzero().squeeze(1).cpu() for row in valid]  # each (n_k,), n_k ≤ T·N
        self.sizes = [len(row) for row in indices]  # n_k
        slots = [fixed_minibatch_slots(n, self.M, self.W) for n in self.sizes]  # each (n_k,)
        self.index = torch.zeros((S, self.M * self.W), dtype=torch.int64)  # (S, M·W)  padding points at sample 0
        mask = torch.zeros((S, self.M * self.W), dtype=torch.bool)  # (S, M·W)
        for k, seed_slots in enumerate(slots):
            mask[k, seed_slots] = True
        self.mask = mask.to(valid.device)
        self.counts = mask.view(S, self.M, self.W).sum(-1).clamp(min=1).to(valid.device)  # (S, M)
        self.row_offsets = (torch.arange(S) * samples).unsqueeze(1)  # (S, 1)  row k starts at k·T·N when flattened
        # Each seed's samples and slots as positions in the flattened (S·…) tensors, all seeds' end to end, so
        # that an epoch's shuffle puts every seed's samples in place with one gather and one scatter.
        starts = [sum(self.sizes[:k]) for k in range(S)]  # where seed k's samples begin, end to end
        self.starts = [torch.full((n,), start) for start, n in zip(starts, self.sizes, strict=True)]  # each (n_k,)
        self.every_start = torch.cat(self.starts)  # (Σ n_k,)
        self.indices = torch.cat(indices)  # (Σ n_k,)
        self.slots = [k * self.M * self.W + seed_slots for k, seed_slots in enumerate(slots)]  # each (n_k,)
        self.every_slot = torch.cat(self.slots)  # (Σ n_k,)

    def columns(self, m: int) -> slice:
        """Minibatch m's columns in an epoch's (S, M·W, …) tensors."""
        return slice(m * self.W, (m + 1) * self.W)

    def shuffle(self, stepping: Tensor) -> Tensor:
        """A new epoch for the seeds in ``stepping``: each one's samples shuffled by its own generator, in
        its minibatches' slots. Returns the samples of every slot, (S, M·W), on the mask's device."""
        seeds = [k for k, on in enumerate(stepping.tolist()) if on]
        if seeds:
            generators = {k: self.random.torch[k] for k in seeds}  # each seed's own draws its permutation
            orders = [torch.randperm(self.sizes[k], generator=g, device=g.device) for k, g in generators.items()]
            order = torch.cat(orders).cpu()  # (Σ n_k,)  each stepping seed's permutation of its n_k samples
            if len(seeds) == len(self.sizes):
                starts, slots = self.every_start, self.every_slot
            else:
                starts, slots = (torch.cat([x[k] for k in seeds]) for x in (self.starts, self.slots))
            self.index.view(-1)[slots] = self.indices[order + starts]
        return self.index.to(self.mask.device)

    def gather(self, *tensors: Tensor) -> list[Tensor]:
        """Each of ``tensors`` (S, T·N, …) gathered into this epoch's minibatches at once, (S, M·W, …)."""
        S = len(self.sizes)
        flat_index = (self.index + self.row_offsets).view(-1).to(tensors[0].device)
        return [x.flatten(0, 1).index_select(0, flat_index).view(S, self.M * self.W, *x.shape[2:]) for x in tensors]


class SeedGenerators:
    """Each seed's random number generators: a ``torch.Generator`` (its actions, its shuffles) and a NumPy
    ``RandomState`` (GRPO's branch depths), both continuing from the global state that seeding set, so that
    a seed draws the same numbers whatever seeds share its process."""

    def __init__(self) -> None:
        self.torch: list[torch.Generator] = []
        self.numpy: list[np.random.RandomState] = []

    def capture(self, device: str) -> None:
        """Add a seed whose generators continue from the global state, right after its seeded build."""
        generator = torch.Generator(device)
        generator.set_state(torch.get_rng_state() if device == "cpu" else torch.cuda.get_rng_state())
        self.torch.append(generator)
        numpy = np.random.RandomState()
        numpy.set_state(np.random.get_state())
        self.numpy.append(numpy)

    def state(self, k: int) -> dict[str, Any]:
        """Seed k's generators, for its checkpoint."""
        return {"torch": self.torch[k].get_state(), "numpy": self.numpy[k].get_state(legacy=False)}

    def load(self, k: int, state: dict[str, Any]) -> None:
        self.torch[k].set_state(state["torch"])
        self.numpy[k].set_state(state["numpy"])


def trajectories_at(x: Tensor, index: Tensor) -> Tensor:
    """The trajectories ``index`` (S, W) of each seed's batch x (S, T, M, …) → (S, T, W, …)."""
    return torch.take_along_dim(x, index.view(*index.shape[:1], 1, index.shape[1], *[1] * (x.dim() - 3)), dim=2)


# ── a stacked network over each seed's masked rows, in chunks of a fixed width ────────────────────────

ROWS = 256
"""The rows of a chunk: wider chunks pad more, narrower ones make more calls."""


def masked_first(mask: Tensor) -> Tensor:
    """Each seed's masked positions first, in their order, cut to whole chunks of ROWS rows: as many chunks
    as the seed with the most masked positions needs, at least one.  mask (S, B) → positions (S, R)."""
    chunks = max(1, -(-int(mask.sum(-1).max()) // ROWS))
    return torch.argsort((~mask).to(torch.uint8), dim=1, stable=True)[:, : ROWS * chunks]


def pick_steps(
    batch: dict[str, Tensor], mask: Tensor, weights: Tensor, members: Tensor, M: int
) -> tuple[dict[str, Tensor], Tensor]:
    """Each seed's masked steps of a minibatch of trajectories, picked out of its (H, M) batch: its steps first,
    in (t, i) order, as many chunks of ROWS rows as the seed with the most steps needs (a seed's chunks never
    depend on its neighbours'). ``batch``: tensors (S, H·M, …); ``mask``, ``weights``: (S, H, W), of the
    minibatch's trajectories ``members`` (S, W). Returns the picked tensors (S, R, …), with ``mask`` and
    ``weight``, and each seed's count of steps, (S,)."""
    S, W = members.shape
    flat_mask = mask.flatten(1, 2)  # (S, H·W)
    rows = masked_first(flat_mask)  # (S, R)
    at_batch = (rows // W) * M + torch.gather(members, 1, rows % W)  # (S, R)  positions in the (H, M) batch
    picked = {
        name: torch.take_along_dim(x, at_batch.view(S, -1, *[1] * (x.dim() - 2)), dim=1) for name, x in batch.items()
    }
    picked |= {"mask": torch.gather(flat_mask, 1, rows), "weight": torch.gather(weights.flatten(1, 2), 1, rows)}
    return picked, flat_mask.sum(-1)


@torch.no_grad()
def log_probs_at(net: StackedNetworks, obs: Tensor, actions: Tensor, mask: Tensor) -> Tensor:
    """log π_k(a|s) at each seed's masked steps, 0 elsewhere.  obs (S, B, obs_dim), mask (S, B) → (S, B).
    Only the masked steps go through the network, picked out and run in chunks of ROWS rows: a seed's chunks
    never depend on how many its neighbours need."""
    rows = masked_first(mask)  # (S, R)
    log_probs = torch.zeros(mask.shape, device=mask.device)  # (S, B)
    for part in rows.split(ROWS, dim=1):
        x = torch.take_along_dim(obs, part.unsqueeze(-1), dim=1)  # (S, ROWS, obs_dim)
        a = torch.take_along_dim(actions, part.view(*part.shape, *[1] * (actions.dim() - 2)), dim=1)
        log_probs.scatter_(1, part, net.log_prob_entropy(net.policy(x), a)[0])
    return torch.where(mask, log_probs, 0.0)
