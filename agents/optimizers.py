"""Any element-wise ``torch.optim`` optimizer over a stack of seeds: Adam, RMSprop, SGD with momentum.

A stack keeps its parameters as one (S, P) tensor, row k seed k's (``networks.StackedNetworks``). A
:class:`SeedOptimizer` gives each seed its own torch optimizer over one leaf parameter, (P,), whose storage
is row k itself: stepping it updates seed k's row in place, and seed k's optimizer *is* a ``torch.optim``
optimizer. Its ``state_dict()`` is a single run's, so a checkpoint moves between a single run and any
stack, in either direction, and the lifecycle (``training.Trainee.optimizer``: checkpoints, resume,
``tracking.memory_report``) handles it as it handles any torch optimizer.

Why one optimizer per row rather than one over the (S, P) tensor: each seed has its own step count t (Adam's
and RMSprop's bias correction; seeds stop their epochs at different minibatches), its own learning rate
(a schedule, GRPO's KL-target factor) and its own state dict; and a seed that does not step must keep its
parameters and state, which an optimizer over the whole tensor would move.

Why seed k's numbers are bit-identical whoever its neighbours are, and however many: these rules are
element-wise. Each new parameter and state element is computed from the same element of the gradient and
of the old state alone::

    Adam:     t ← t + 1,  m ← β₁ m + (1 − β₁) g,  v ← β₂ v + (1 − β₂) g²,
              θ ← θ − α / (1 − β₁ᵗ) · m / (√v / √(1 − β₂ᵗ) + ε)
    RMSprop:  v ← α v + (1 − α) g²,  θ ← θ − η g / (√v + ε)
    SGD:      b ← μ b + g,  θ ← θ − η b

Row k's optimizer sees only row k, a contiguous (P,) tensor, and runs the same operations as a single
run's optimizer over the same parameters, so its numbers are the single run's for any S. What couples the
seeds before the step is per seed too: the gradient of the summed losses lands in each seed's own row, and
the clip divides each row by its own norm (``stacked.clip_grad_norms_``). A rule that mixes elements (LBFGS's
line search over the whole model) has no place here; :func:`adam`, :func:`rmsprop` and :func:`sgd` are
element-wise.

Costs. S optimizers take S small steps where a stacked rule took one: at S = 8 on CartPole's 9,155
parameters, about 0.55 ms a gradient step instead of 0.18 ms, a few percent of a PPO iteration. And the
first torch optimizer of a process imports ``torch._dynamo`` (``Optimizer``'s methods are wrapped by
``torch._disable_dynamo``): about 1 s of CPU, once per trainer process; later ones cost microseconds. That is
the price of torch's own classes rather than a copy of their arithmetic and of their state dicts.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, Literal

import torch
from torch import Tensor, nn

from agents.networks import LAYOUT_WARNING
from agents.stacked import clip_grad_norms_

OptimizerFactory = Callable[[list[nn.Parameter]], torch.optim.Optimizer]
"""Builds a single run's torch optimizer over the parameters given, e.g. ``partial(torch.optim.Adam, lr=3e-4)``."""

OptimizerName = Literal["adam", "rmsprop", "sgd"]


def adam(lr: float, eps: float = 1e-5, betas: tuple[float, float] = (0.9, 0.999)) -> OptimizerFactory:
    """Adam (Kingma & Ba 2015), ``torch.optim.Adam``: PPO's and GRPO's, with ε = 1e-5 as SB3 and CleanRL set it
    (torch's default is 1e-8)."""
    return partial(torch.optim.Adam, lr=lr, betas=betas, eps=eps)


def rmsprop(lr: float, eps: float = 1e-5, alpha: float = 0.99) -> OptimizerFactory:
    """RMSprop (Tieleman & Hinton 2012), ``torch.optim.RMSprop``: A2C's, with α = 0.99 and ε = 1e-5 as SB3's A2C
    sets them (ε outside the square root, as torch's RMSprop adds it; TensorFlow's adds it inside)."""
    return partial(torch.optim.RMSprop, lr=lr, alpha=alpha, eps=eps)


def sgd(lr: float, momentum: float = 0.0) -> OptimizerFactory:
    """Stochastic gradient descent, with heavy-ball momentum μ (``torch.optim.SGD``)."""
    return partial(torch.optim.SGD, lr=lr, momentum=momentum)


RULES: dict[str, Callable[..., OptimizerFactory]] = {"adam": adam, "rmsprop": rmsprop, "sgd": sgd}


def optimizer_factory(name: OptimizerName, lr: float, **settings: Any) -> OptimizerFactory:
    """The rule a config names (:func:`adam`, :func:`rmsprop` or :func:`sgd`) at learning rate ``lr``, with the
    ``settings`` that rule takes (``eps``, ``betas``, ``alpha``, ``momentum``) and its defaults otherwise."""
    if name not in RULES:
        raise ValueError(f"unknown optimizer {name!r}: choose one of {', '.join(map(repr, RULES))}")
    return RULES[name](lr, **settings)


class SeedOptimizer:
    """One torch optimizer per row of the (S, P) stacked parameter ``flat``, built by ``make``.

    ``flat.grad`` is preallocated (``networks.stack_parameters``); seed k's optimizer steps a leaf (P,) whose
    data is row k of ``flat`` and whose gradient, set before each step, is row k of ``flat.grad``. A seed
    outside ``stepping`` keeps its parameters and its optimizer's state (moments, step count) as they are.
    """

    def __init__(self, flat: nn.Parameter, make: OptimizerFactory) -> None:
        if flat.dim() != 2 or flat.grad is None:
            raise ValueError(
                "SeedOptimizer needs the (S, P) stacked parameter with its gradient preallocated, as "
                "networks.stack_parameters makes it"
            )
        self.flat = flat
        self.rows = [nn.Parameter(flat.data[k]) for k in range(flat.shape[0])]  # each (P,), row k's storage
        self.optimizers = [make([row]) for row in self.rows]

    def for_seed(self, k: int) -> torch.optim.Optimizer:
        """Seed k's torch optimizer, as a single run has it: its learning rate, its state, its state dict."""
        return self.optimizers[k]

    def set_learning_rates(self, rates: Sequence[float]) -> None:
        """Seed k's learning rate becomes ``rates[k]`` (its schedule's value this iteration)."""
        if len(rates) != len(self.optimizers):
            raise ValueError(f"{len(rates)} learning rates for a stack of {len(self.optimizers)} seeds")
        for optimizer, lr in zip(self.optimizers, rates, strict=True):
            for group in optimizer.param_groups:
                group["lr"] = float(lr)

    def gradient_step(self, loss: Tensor, stepping: Tensor, max_grad_norm: float) -> None:
        """One gradient step of every seed in ``stepping`` (S,) bool: the gradient of ``loss`` (the sum of the
        seeds' losses, so each seed's gradient lands in its own row), each seed's norm clipped to
        ``max_grad_norm``, then each stepping seed's optimizer."""
        self.flat.grad.zero_()
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=LAYOUT_WARNING)
            loss.backward()
        clip_grad_norms_(self.flat.grad, max_grad_norm)
        self.step(stepping)

    def step(self, stepping: Tensor) -> None:
        """One step of the optimizers of the seeds where ``stepping`` (S,) bool is True, on ``flat.grad``."""
        for k, on in enumerate(stepping.tolist()):
            if on:
                # A view of row k of the stacked gradient, set anew each step: zero_grad(set_to_none=True)
                # on a seed's optimizer would otherwise detach it from the row for good.
                self.rows[k].grad = self.flat.grad[k]
                self.optimizers[k].step()
