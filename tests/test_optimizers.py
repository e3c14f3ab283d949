"""A torch optimizer per seed over a stack's rows (``agents/optimizers.py``): hand-computed steps, seeds that do
not step, seed k bit-identical to a single run at any stack size, and state dicts that move between a single
run and any stack, old checkpoints' included."""

from __future__ import annotations

import copy
import io
import subprocess
import sys

import pytest
import torch
from torch import Tensor, nn

from agents.optimizers import OptimizerFactory, SeedOptimizer, optimizer_factory
from agents.stacked import clip_grad_norms_

START = [[1.0, 2.0], [3.0, 4.0]]
GRAD = [[3.0, -4.0], [0.3, 0.4]]  # row 0's norm is 5, row 1's 0.5
FACTORIES = {
    "adam": optimizer_factory("adam", lr=3e-3, eps=1e-5),
    "rmsprop": optimizer_factory("rmsprop", lr=1e-3, alpha=0.99, eps=1e-5),
    "sgd": optimizer_factory("sgd", lr=1e-2, momentum=0.9),
}


def stacked(start: Tensor) -> nn.Parameter:
    """An (S, P) parameter with its gradient preallocated, as ``networks.stack_parameters`` makes it."""
    flat = nn.Parameter(start.clone())
    flat.grad = torch.zeros_like(flat.data)  # (S, P)
    return flat


def linear_loss(flat: nn.Parameter, grad: Tensor) -> Tensor:
    """Σ_k ⟨g_k, θ_k⟩, whose gradient is exactly ``grad``, row k in row k."""
    return (flat * grad).sum()


def test_one_adam_step_by_hand_clips_each_seed_by_its_own_norm() -> None:
    # Adam's first step: m = (1 − β₁) g, v = (1 − β₂) g², m̂ = g, v̂ = g², so θ ← θ − α g / (|g| + ε).
    # Row 0's gradient is clipped to norm 1, (0.6, −0.8); row 1's (norm 0.5) is not.
    flat = stacked(torch.tensor(START))
    optimizer = SeedOptimizer(flat, optimizer_factory("adam", lr=0.1, eps=1e-5))
    optimizer.gradient_step(linear_loss(flat, torch.tensor(GRAD)), torch.tensor([True, True]), max_grad_norm=1.0)
    # 1 − 0.1·0.6/0.60001, 2 + 0.1·0.8/0.80001; 3 − 0.1·0.3/0.30001, 4 − 0.1·0.4/0.40001
    expected = torch.tensor([[0.9000016667, 2.0999987500], [2.9000033332, 3.9000025000]])
    torch.testing.assert_close(flat.data, expected, atol=1e-6, rtol=0)
    state = optimizer.for_seed(0).state[optimizer.rows[0]]
    assert float(state["step"]) == 1.0
    torch.testing.assert_close(state["exp_avg"], torch.tensor([0.06, -0.08]))  # (1 − 0.9)·g
    torch.testing.assert_close(state["exp_avg_sq"], torch.tensor([0.00036, 0.00064]))  # (1 − 0.999)·g²


def test_one_rmsprop_step_by_hand() -> None:
    # RMSprop's first step: v = (1 − α) g² = 0.01 g², θ ← θ − η g / (√v + ε) = θ − η g / (0.1 |g| + ε).
    flat = stacked(torch.tensor(START))
    optimizer = SeedOptimizer(flat, optimizer_factory("rmsprop", lr=0.01, alpha=0.99, eps=1e-5))
    optimizer.gradient_step(linear_loss(flat, torch.tensor(GRAD)), torch.tensor([True, True]), max_grad_norm=10.0)
    # 1 − 0.01·3/0.30001, 2 + 0.01·4/0.40001; 3 − 0.01·0.3/0.03001, 4 − 0.01·0.4/0.04001
    expected = torch.tensor([[0.9000033332, 2.0999975001], [2.9000333222, 3.9000249938]])
    torch.testing.assert_close(flat.data, expected, atol=1e-6, rtol=0)
    torch.testing.assert_close(
        optimizer.for_seed(1).state[optimizer.rows[1]]["square_avg"], torch.tensor([9e-4, 16e-4])
    )


@pytest.mark.parametrize("name", FACTORIES)
def test_a_seed_outside_stepping_keeps_its_parameters_and_state(name: str) -> None:
    flat = stacked(torch.tensor(START))
    optimizer = SeedOptimizer(flat, FACTORIES[name])
    grad = torch.tensor(GRAD)
    optimizer.gradient_step(linear_loss(flat, grad), torch.tensor([True, True]), max_grad_norm=10.0)
    before, state = flat.data.clone(), copy.deepcopy(optimizer.for_seed(1).state_dict())
    for _ in range(2):
        optimizer.gradient_step(linear_loss(flat, grad), torch.tensor([True, False]), max_grad_norm=10.0)
    assert not torch.equal(flat.data[0], before[0])
    assert torch.equal(flat.data[1], before[1])
    after = optimizer.for_seed(1).state_dict()
    for key, value in state["state"][0].items():
        assert torch.equal(after["state"][0][key], value), key
    # A seed that never stepped has no state, as a single run's optimizer before its first step.
    idle = SeedOptimizer(stacked(torch.tensor(START)), FACTORIES[name])
    idle.gradient_step(linear_loss(idle.flat, grad), torch.tensor([True, False]), max_grad_norm=10.0)
    assert idle.for_seed(1).state_dict()["state"] == {}


def single_run(start: Tensor, make: OptimizerFactory) -> tuple[nn.Parameter, torch.optim.Optimizer]:
    """A single run's torch optimizer over one seed's parameters alone, (P,)."""
    parameter = nn.Parameter(start.clone())
    return parameter, make([parameter])


def single_step(parameter: nn.Parameter, optimizer: torch.optim.Optimizer, grad: Tensor, max_norm: float) -> None:
    """A single run's gradient step: its gradient clipped as a stack of one clips it, then its optimizer."""
    clipped = grad.clone().unsqueeze(0)  # (1, P)
    clip_grad_norms_(clipped, max_norm)
    parameter.grad = clipped.squeeze(0)
    optimizer.step()


def assert_same_state(ours: torch.optim.Optimizer, theirs: torch.optim.Optimizer) -> None:
    """The two optimizers' state dicts are equal, tensors bit for bit."""
    a, b = ours.state_dict(), theirs.state_dict()
    assert a["param_groups"] == b["param_groups"]
    assert a["state"].keys() == b["state"].keys()
    for i, state in a["state"].items():
        assert state.keys() == b["state"][i].keys()
        for key, value in state.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(b["state"][i][key])), key


@pytest.mark.parametrize("name", FACTORIES)
def test_a_seeds_row_is_a_single_runs_optimizer_bit_for_bit_at_any_stack_size(name: str) -> None:
    # Element-wise rules on each row alone: seed k's numbers cannot depend on its neighbours or their number.
    # P is odd and over a vector register's width many times, so vectorized bodies and scalar tails both run.
    P, steps, max_norm = 1001, 6, 20.0
    generator = torch.Generator().manual_seed(0)
    start = torch.randn(8, P, generator=generator)  # (8, P)
    grads = [torch.randn(8, P, generator=generator) for _ in range(steps)]  # each (8, P); norms ≈ 32, so clipped
    stepping = (torch.rand(steps, 8, generator=generator) < 0.7).tolist()  # (steps, 8)
    singles = [single_run(start[k], FACTORIES[name]) for k in range(8)]
    for t in range(steps):
        for k, (parameter, optimizer) in enumerate(singles):
            if stepping[t][k]:
                single_step(parameter, optimizer, grads[t][k], max_norm)
    for S in (1, 2, 8):
        flat = stacked(start[:S])
        optimizer = SeedOptimizer(flat, FACTORIES[name])
        for t in range(steps):
            optimizer.gradient_step(linear_loss(flat, grads[t][:S]), torch.tensor(stepping[t][:S]), max_norm)
        for k in range(S):
            assert torch.equal(flat.data[k], singles[k][0].data), (S, k)
            assert_same_state(optimizer.for_seed(k), singles[k][1])


@pytest.mark.parametrize("name", FACTORIES)
def test_a_seeds_state_dict_moves_to_a_single_run_and_into_another_stack(name: str) -> None:
    P, max_norm = 257, 20.0
    generator = torch.Generator().manual_seed(1)
    start = torch.randn(4, P, generator=generator)  # (4, P)

    def grads(S: int) -> Tensor:
        return torch.randn(S, P, generator=generator)  # (S, P)

    # Seed 1 of a stack of three steps three times ...
    flat = stacked(start[:3])
    stack = SeedOptimizer(flat, FACTORIES[name])
    for _ in range(3):
        stack.gradient_step(linear_loss(flat, grads(3)), torch.ones(3, dtype=torch.bool), max_norm)
    # ... then resumes as a single run (a deep copy: torch's load_state_dict keeps the tensors it is given) ...
    parameter, single = single_run(flat.data[1], FACTORIES[name])
    single.load_state_dict(copy.deepcopy(stack.for_seed(1).state_dict()))
    assert_same_state(single, stack.for_seed(1))
    for _ in range(2):
        grad = grads(3)
        single_step(parameter, single, grad[1], max_norm)
        stack.gradient_step(linear_loss(flat, grad), torch.ones(3, dtype=torch.bool), max_norm)
    assert torch.equal(parameter.data, flat.data[1])
    # ... and the single run resumes as seed 2 of a stack of four, through a checkpoint's bytes.
    other = stacked(start)
    other.data[2] = parameter.data
    into = SeedOptimizer(other, FACTORIES[name])
    buffer = io.BytesIO()
    torch.save(single.state_dict(), buffer)
    into.for_seed(2).load_state_dict(torch.load(io.BytesIO(buffer.getvalue()), weights_only=True))
    assert_same_state(into.for_seed(2), single)
    for _ in range(2):
        grad = grads(4)
        single_step(parameter, single, grad[2], max_norm)
        into.gradient_step(linear_loss(other, grad), torch.tensor([False, True, True, False]), max_norm)
    assert torch.equal(other.data[2], parameter.data)
    assert torch.equal(other.data[0], start[0])  # not stepping, not moved
    assert_same_state(into.for_seed(2), single)


def test_an_old_checkpoints_adam_state_still_loads() -> None:
    # What the stack's hand-written Adam wrote before it used torch's: torch.optim.Adam's state dict, written out.
    exp_avg, exp_avg_sq = torch.tensor([0.01, -0.02, 0.03]), torch.tensor([1e-4, 4e-4, 9e-4])
    old = {
        "state": {0: {"step": torch.tensor(3.0), "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}},
        "param_groups": [
            {
                "lr": 3e-4,
                "betas": (0.9, 0.999),
                "eps": 1e-5,
                "weight_decay": 0,
                "amsgrad": False,
                "maximize": False,
                "foreach": None,
                "capturable": False,
                "differentiable": False,
                "fused": True,
                "decoupled_weight_decay": False,
                "params": [0],
            }
        ],
    }
    never_stepped = {"state": {}, "param_groups": copy.deepcopy(old["param_groups"])}
    flat = stacked(torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]))
    optimizer = SeedOptimizer(flat, optimizer_factory("adam", lr=1e-3, eps=1e-5))
    optimizer.for_seed(0).load_state_dict(copy.deepcopy(old))
    optimizer.for_seed(1).load_state_dict(copy.deepcopy(never_stepped))
    parameter, single = single_run(flat.data[0], optimizer_factory("adam", lr=1e-3, eps=1e-5))
    single.load_state_dict(copy.deepcopy(old))
    grad = torch.tensor([[0.1, 0.2, -0.3], [0.4, -0.5, 0.6]])
    optimizer.gradient_step(linear_loss(flat, grad), torch.tensor([True, True]), max_grad_norm=10.0)
    single_step(parameter, single, grad[0], 10.0)
    assert torch.equal(flat.data[0], parameter.data)
    assert float(optimizer.for_seed(0).state_dict()["state"][0]["step"]) == 4.0
    assert float(optimizer.for_seed(1).state_dict()["state"][0]["step"]) == 1.0
    # The loaded learning rate stands until the stack sets this iteration's.
    optimizer.set_learning_rates([1e-4, 2e-4])
    assert [o.param_groups[0]["lr"] for o in optimizer.optimizers] == [1e-4, 2e-4]


def test_the_factory_names_torchs_optimizers_and_refuses_others() -> None:
    parameter = nn.Parameter(torch.zeros(2))
    adam = optimizer_factory("adam", lr=3e-4)([parameter])
    assert isinstance(adam, torch.optim.Adam) and adam.defaults["eps"] == 1e-5
    rmsprop = optimizer_factory("rmsprop", lr=7e-4)([parameter])
    assert isinstance(rmsprop, torch.optim.RMSprop)
    assert (rmsprop.defaults["alpha"], rmsprop.defaults["eps"]) == (0.99, 1e-5)  # SB3's A2C
    assert isinstance(optimizer_factory("sgd", lr=0.1, momentum=0.9)([parameter]), torch.optim.SGD)
    with pytest.raises(ValueError, match="choose one of"):
        optimizer_factory("adagrad", lr=0.1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="momentum"):
        optimizer_factory("adam", lr=0.1, momentum=0.9)  # a setting the rule does not take


def test_torchs_compiler_stack_is_imported_by_the_first_optimizer_not_by_importing_the_agents() -> None:
    # torch.optim's methods import torch._dynamo on their first call: about 1 s of CPU once per process that
    # trains, the price of torch's own optimizers (a second optimizer costs microseconds). Importing the agents
    # does not pay it, so a process that trains nothing (eval, report) does not.
    script = (
        "import sys, torch\nimport agents.grpo, agents.ppo\nfrom agents.optimizers import SeedOptimizer, "
        "optimizer_factory\nprint('torch._dynamo' in sys.modules)\n"
        "flat = torch.nn.Parameter(torch.zeros(2, 3)); flat.grad = torch.zeros_like(flat)\n"
        "SeedOptimizer(flat, optimizer_factory('adam', lr=0.1))\nprint('torch._dynamo' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"]
