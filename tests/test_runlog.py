"""Tests for agents/runlog.py: run directories, safe atomic checkpoints, progress.csv, summary, signals."""

from __future__ import annotations

import csv
import json
import os
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from agents import runlog
from agents.rundir import CHECKPOINT, prepare_run_dir, write_summary
from agents.runlog import (
    MetricLog,
    NonFiniteError,
    StopFlag,
    check_finite,
    load_checkpoint,
    load_rng_state,
    rng_state,
    save_checkpoint,
)
from envs.errors import BadInput
from tests.conftest import wait_for

EXPECTED = {"algo": "ppo", "env_id": "CartPole-v1"}


def _read_csv(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader)


# ── run directory ────────────────────────────────────────────────────────────────────────────────


def test_prepare_run_dir_creates_a_new_directory(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "a" / "seed0"
    prepare_run_dir(run_dir, resume=False)
    assert run_dir.is_dir()
    # An existing empty directory is not a run yet: it may be used.
    prepare_run_dir(run_dir, resume=False)


def test_prepare_run_dir_refuses_a_directory_with_a_checkpoint_or_unknown_files(tmp_path: Path) -> None:
    (tmp_path / "progress.csv").write_text("global_step,wall_time_s\n")
    save_checkpoint(tmp_path, {**EXPECTED})
    with pytest.raises(BadInput, match="--resume"):
        prepare_run_dir(tmp_path, resume=False)
    assert (tmp_path / "progress.csv").read_text() == "global_step,wall_time_s\n"
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(BadInput, match="another --run-dir"):
        prepare_run_dir(other, resume=False)
    assert (other / "notes.txt").read_text() == "mine"


def test_prepare_run_dir_starts_again_where_no_checkpoint_was_written(tmp_path: Path) -> None:
    # What a start writes before its first checkpoint: nothing in it can be continued, so it is cleared.
    for name in ("config.yaml", "meta.json", "progress.csv", "events.out.tfevents.1.host.1.0"):
        (tmp_path / name).write_text("x")
    prepare_run_dir(tmp_path, resume=False).release()
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # released on an empty folder, the lock leaves too


def test_prepare_run_dir_keeps_the_plots_of_a_start_that_stopped(tmp_path: Path) -> None:
    # `testbed plot RUN_DIR` draws into RUN_DIR/plots; the same train command must still start the run again.
    (tmp_path / "progress.csv").write_text("x")
    (tmp_path / "plots").mkdir()
    (tmp_path / "plots" / "curves-steps.png").write_bytes(b"png")
    prepare_run_dir(tmp_path, resume=False).release()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != ".lock") == ["plots"]  # progress.csv cleared
    assert (tmp_path / "plots" / "curves-steps.png").read_bytes() == b"png"


def test_prepare_run_dir_refuses_resume_without_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "progress.csv").write_text("")
    with pytest.raises(BadInput, match=CHECKPOINT):
        prepare_run_dir(tmp_path, resume=True)
    with pytest.raises(BadInput, match=CHECKPOINT):
        prepare_run_dir(tmp_path / "missing", resume=True)
    save_checkpoint(tmp_path, {**EXPECTED})
    prepare_run_dir(tmp_path, resume=True)


# ── checkpoints ──────────────────────────────────────────────────────────────────────────────────


def test_checkpoint_round_trip(tmp_path: Path) -> None:
    model = torch.nn.Linear(3, 2)
    pcg = np.random.default_rng(7)
    pcg.random(5)
    pcg_state = pcg.bit_generator.state
    assert pcg_state["state"]["state"] > 2**64, "PCG64's state is a 128-bit Python int"
    np.random.seed(3)
    legacy_state = np.random.get_state(legacy=False)
    assert legacy_state["state"]["key"].dtype == np.uint32
    payload: dict[str, Any] = {
        **EXPECTED,
        "global_step": 4096,
        "model": model.state_dict(),
        "arrays": {
            "f32": np.arange(6, dtype=np.float32).reshape(2, 3),
            "bool": np.array([True, False, True]),
            "u32": np.array([0, 2**32 - 1], dtype=np.uint32),
            "f64_view": np.arange(10.0)[::2],  # not contiguous
        },
        "legacy_rng": legacy_state,
        "pcg": pcg_state,
        "nested": {"list": [1, 2.5, "x", None, True, [np.float32(1.5), np.int64(-3)]], "tuple": (1, 2)},
    }
    save_checkpoint(tmp_path, payload)
    loaded = load_checkpoint(tmp_path, EXPECTED)

    assert loaded["format"] == runlog.CHECKPOINT_FORMAT
    assert loaded["algo"] == "ppo" and loaded["env_id"] == "CartPole-v1" and loaded["global_step"] == 4096
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded["model"][name], tensor)
    for name, array in payload["arrays"].items():
        got = loaded["arrays"][name]
        assert isinstance(got, np.ndarray) and got.dtype == array.dtype, name
        assert np.array_equal(got, array), name
    assert loaded["nested"] == {"list": [1, 2.5, "x", None, True, [1.5, -3]], "tuple": [1, 2]}

    # The RNG states still work as RNG states: the same draws follow.
    assert loaded["pcg"] == pcg_state
    again = np.random.default_rng()
    again.bit_generator.state = loaded["pcg"]
    assert np.array_equal(again.random(4), pcg.random(4))
    np.random.set_state(loaded["legacy_rng"])
    first = np.random.random(4)
    np.random.set_state(legacy_state)
    assert np.array_equal(np.random.random(4), first)


def test_a_checkpoint_holds_a_views_values_not_the_storage_it_views(tmp_path: Path) -> None:
    # A stacked seed's weights are views of one (S, P) tensor of every seed's: its checkpoint holds its own row.
    stacked = torch.arange(64 * 4096, dtype=torch.float32).reshape(64, 4096)  # 1 MiB
    save_checkpoint(tmp_path, {**EXPECTED, "model": {"w": stacked[3, :1024].view(32, 32), "b": stacked[3, 1024:1056]}})
    loaded = load_checkpoint(tmp_path, EXPECTED)["model"]
    assert torch.equal(loaded["w"], stacked[3, :1024].view(32, 32)) and torch.equal(loaded["b"], stacked[3, 1024:1056])
    assert (tmp_path / CHECKPOINT).stat().st_size < 16 * 1024  # 4 KiB of values and the format, not 1 MiB


def test_rng_state_round_trip_through_checkpoint(tmp_path: Path) -> None:
    torch.manual_seed(11)
    np.random.seed(11)
    save_checkpoint(tmp_path, {**EXPECTED, "rng": rng_state()})
    want_torch, want_numpy = torch.rand(3), np.random.random(3)
    torch.rand(10), np.random.random(10)  # move both generators on
    load_rng_state(load_checkpoint(tmp_path, EXPECTED)["rng"])
    assert torch.equal(torch.rand(3), want_torch)
    assert np.array_equal(np.random.random(3), want_numpy)


def _mark(path: str) -> None:
    Path(path).write_text("unpickling ran code")


class Evil:
    """Unpickling this object would call ``_mark``: code execution, which a checkpoint must not allow."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (_mark, (str(self.marker),))


def test_load_refuses_arbitrary_pickled_objects(tmp_path: Path) -> None:
    marker = tmp_path / "marker.txt"
    torch.save({"format": runlog.CHECKPOINT_FORMAT, **EXPECTED, "payload": Evil(marker)}, tmp_path / CHECKPOINT)
    with pytest.raises(BadInput, match="corrupted or not a checkpoint"):
        load_checkpoint(tmp_path, EXPECTED)
    assert not marker.exists(), "loading the checkpoint executed pickled code"


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty"])
def test_load_refuses_a_damaged_file(tmp_path: Path, damage: str) -> None:
    save_checkpoint(tmp_path, {**EXPECTED, "model": torch.nn.Linear(8, 8).state_dict()})
    path = tmp_path / CHECKPOINT
    data = path.read_bytes()
    path.write_bytes({"truncate": data[: len(data) // 2], "garbage": os.urandom(256), "empty": b""}[damage])
    with pytest.raises(BadInput, match="Start a new run"):
        load_checkpoint(tmp_path, EXPECTED)


def test_load_refuses_a_checkpoint_of_another_run(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, {**EXPECTED})
    with pytest.raises(BadInput, match="algo='ppo'"):
        load_checkpoint(tmp_path, {"algo": "grpo", "env_id": "CartPole-v1"})
    with pytest.raises(BadInput, match="env_id='CartPole-v1'"):
        load_checkpoint(tmp_path, {"algo": "ppo", "env_id": "Pendulum-v1"})
    assert load_checkpoint(tmp_path, EXPECTED)["algo"] == "ppo"


def test_load_refuses_an_unknown_format(tmp_path: Path) -> None:
    torch.save({**EXPECTED}, tmp_path / CHECKPOINT)  # plain data, but no format marker
    with pytest.raises(BadInput, match="format"):
        load_checkpoint(tmp_path, EXPECTED)


def test_crash_mid_write_keeps_the_previous_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    save_checkpoint(tmp_path, {**EXPECTED, "global_step": 100, "weights": torch.arange(1000.0)})
    before = (tmp_path / CHECKPOINT).read_bytes()

    def crashing_save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        f.write(b"PK\x03\x04 partial")
        raise OSError("simulated crash mid-write")

    monkeypatch.setattr(runlog.torch, "save", crashing_save)
    with pytest.raises(OSError, match="simulated crash"):
        save_checkpoint(tmp_path, {**EXPECTED, "global_step": 200, "weights": torch.zeros(1000)})
    monkeypatch.undo()

    assert (tmp_path / CHECKPOINT).read_bytes() == before
    loaded = load_checkpoint(tmp_path, EXPECTED)
    assert loaded["global_step"] == 100
    assert torch.equal(loaded["weights"], torch.arange(1000.0))


@pytest.mark.parametrize(
    "entry,where",
    [
        ({"model": {"head.weight": torch.tensor([0.5, float("nan")])}}, "model.head.weight"),
        ({"optimizer": {"state": {0: {"exp_avg_sq": torch.tensor([float("inf")])}}}}, "optimizer.state.0.exp_avg_sq"),
        ({"normalizers": {"obs_rms": {"var": np.array([1.0, -np.inf])}}}, "normalizers.obs_rms.var"),
    ],
    ids=["nan-weight", "inf-optimizer-state", "inf-normalizer-array"],
)
def test_load_refuses_a_checkpoint_holding_nan_or_inf(tmp_path: Path, entry: dict[str, Any], where: str) -> None:
    save_checkpoint(tmp_path, {**EXPECTED, "global_step": 768, **entry})
    with pytest.raises(runlog.NonFiniteCheckpoint, match=rf"holds NaN or inf values \(in {where}\)") as error:
        load_checkpoint(tmp_path, EXPECTED)
    assert error.value.global_step == 768 and isinstance(error.value, BadInput)
    assert str(tmp_path / CHECKPOINT) in str(error.value) and "\n" not in str(error.value)


def test_load_leaves_the_envs_and_generators_state_to_their_owners(tmp_path: Path) -> None:
    # An env's own state may hold an inf (a bound, a timer); only what was learned must be finite.
    save_checkpoint(
        tmp_path,
        {
            **EXPECTED,
            "model": {"w": torch.ones(2)},
            "env_state": {"bound": np.array([np.inf])},
            "rollout": {"next_obs": np.array([np.nan])},
        },
    )
    assert np.isinf(load_checkpoint(tmp_path, EXPECTED)["env_state"]["bound"]).all()


def test_record_diverged_writes_a_summary_a_bench_keeps(tmp_path: Path) -> None:
    error = runlog.NonFiniteCheckpoint("checkpoint.pt holds NaN", 512)
    runlog.record_diverged(tmp_path, error, {"algo": "ppo", "env_id": "CartPole-v1", "seed": 3})
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary == {
        "algo": "ppo",
        "env_id": "CartPole-v1",
        "seed": 3,
        "status": "failed",
        "total_steps": 512,
        "error": "checkpoint.pt holds NaN",
        "diverged": True,
    }


def test_check_progress_refuses_a_missing_or_shortened_progress_csv(tmp_path: Path) -> None:
    (tmp_path / "progress.csv").write_bytes(b"global_step\n256\n512\n")
    runlog.check_progress(tmp_path, 20)  # as long as the checkpoint recorded: fine
    runlog.check_progress(tmp_path, 16)  # longer (rows after the checkpoint, cut back by the resume): fine
    runlog.check_progress(tmp_path, None)  # an older checkpoint, which recorded no size
    with pytest.raises(BadInput, match=r"holds 20 bytes, fewer than the 24 .* Restore progress.csv from a backup"):
        runlog.check_progress(tmp_path, 24)
    (tmp_path / "progress.csv").unlink()
    with pytest.raises(BadInput, match=r"progress.csv is missing, but the run has a checkpoint .* start the run again"):
        runlog.check_progress(tmp_path, None)
    with pytest.raises(BadInput, match="is missing"):  # MetricLog checks before it makes anything
        MetricLog(tmp_path, COLUMNS, resume_step=512, csv_bytes=20)
    assert list(tmp_path.iterdir()) == []


def test_save_overwrites_the_previous_checkpoint(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, {**EXPECTED, "global_step": 1})
    save_checkpoint(tmp_path, {**EXPECTED, "global_step": 2})
    assert load_checkpoint(tmp_path, EXPECTED)["global_step"] == 2
    assert [p.name for p in tmp_path.iterdir()] == [CHECKPOINT], "no temporary file is left behind"


# ── metrics ──────────────────────────────────────────────────────────────────────────────────────

COLUMNS = ["charts/SPS", "losses/value_loss"]


def test_metric_log_writes_progress_csv(tmp_path: Path) -> None:
    log = MetricLog(tmp_path, COLUMNS, resume_step=None)
    log.row(128, 1.23456, {"charts/SPS": 100.0, "losses/value_loss": 0.5})
    log.row(256, 2.5, {"charts/SPS": 110.0, "losses/value_loss": float("nan"), "not/a_column": 1.0})
    log.close()
    header, rows = _read_csv(tmp_path / "progress.csv")
    assert header[:2] == ["global_step", "wall_time_s"]
    assert header == ["global_step", "wall_time_s", *COLUMNS]
    assert [r["global_step"] for r in rows] == ["128", "256"]
    assert rows[0]["wall_time_s"] == "1.235"
    assert float(rows[0]["charts/SPS"]) == 100.0 and float(rows[0]["losses/value_loss"]) == 0.5
    assert rows[1]["losses/value_loss"] == "", "a NaN is written as an empty cell"
    assert any(p.name.startswith("events.out.tfevents") for p in tmp_path.iterdir())


def test_a_reader_sees_each_row_as_it_is_written(tmp_path: Path) -> None:
    """A study's pruner reads a running trial's progress.csv: an evaluation it cannot see yet is training wasted."""
    log = MetricLog(tmp_path, COLUMNS, resume_step=None)
    log.row(128, 1.0, {"charts/SPS": 100.0})
    assert [r["global_step"] for r in _read_csv(tmp_path / "progress.csv")[1]] == ["128"]
    log.row(256, 2.0, {"charts/SPS": 100.0})
    assert [r["global_step"] for r in _read_csv(tmp_path / "progress.csv")[1]] == ["128", "256"]
    log.close()


def test_metric_log_resume_drops_rows_after_the_checkpoint(tmp_path: Path) -> None:
    log = MetricLog(tmp_path, COLUMNS, resume_step=None)
    for step in (100, 200, 300, 400):
        log.row(step, step / 100, {"charts/SPS": float(step)})
    log.close()

    log = MetricLog(tmp_path, COLUMNS, resume_step=200)
    log.row(300, 9.0, {"charts/SPS": 3.0})
    log.close()
    header, rows = _read_csv(tmp_path / "progress.csv")
    assert header == ["global_step", "wall_time_s", *COLUMNS]
    assert [r["global_step"] for r in rows] == ["100", "200", "300"]
    assert [float(r["charts/SPS"]) for r in rows] == [100.0, 200.0, 3.0]


def test_metric_log_skips_non_finite_scalars(tmp_path: Path) -> None:
    log = MetricLog(tmp_path, COLUMNS, resume_step=None)
    written: list[tuple[str, float, int]] = []
    log.writer.add_scalar = lambda tag, value, step: written.append((tag, value, step))  # type: ignore[method-assign]
    log.scalars(64, {"charts/episodic_return": 12.5, "losses/a": float("nan"), "losses/b": float("inf"), "c": None})
    log.close()
    assert written == [("charts/episodic_return", 12.5, 64)]


# ── failures, summary, signals ───────────────────────────────────────────────────────────────────


def test_check_finite_accepts_finite_values() -> None:
    check_finite({"losses/policy_loss": 0.1, "losses/value_loss": 2.0}, torch.nn.Linear(2, 1))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_check_finite_rejects_a_non_finite_loss(bad: float) -> None:
    with pytest.raises(NonFiniteError, match="last good checkpoint is kept") as error:
        check_finite({"losses/policy_loss": 0.1, "losses/value_loss": bad}, torch.nn.Linear(2, 1))
    assert "losses/value_loss" in str(error.value) and "losses/policy_loss" not in str(error.value)


def test_check_finite_rejects_a_nan_parameter() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.Linear(4, 1))
    with torch.no_grad():
        model[1].bias[0] = float("nan")
    with pytest.raises(NonFiniteError, match="last good checkpoint is kept") as error:
        check_finite({"losses/value_loss": 1.0}, model)
    assert "1.bias" in str(error.value) and "0.weight" not in str(error.value)


def test_write_summary_turns_non_finite_numbers_into_null(tmp_path: Path) -> None:
    summary = {
        "algo": "ppo",
        "status": "failed",
        "total_steps": 1000,
        "sps": float("inf"),
        "final_eval_return_mean": float("nan"),
        "final_eval_return_std": -float("inf"),
        "wall_time_s": 1.5,
    }
    write_summary(tmp_path, summary)

    def refuse(constant: str) -> None:
        raise AssertionError(f"summary.json holds {constant}, which is not JSON")

    loaded = json.loads((tmp_path / "summary.json").read_text(), parse_constant=refuse)
    assert loaded == {
        "algo": "ppo",
        "status": "failed",
        "total_steps": 1000,
        "sps": None,
        "final_eval_return_mean": None,
        "final_eval_return_std": None,
        "wall_time_s": 1.5,
    }


def test_stop_flag_turns_sigterm_into_a_flag() -> None:
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    with StopFlag() as stop:
        assert not stop.raised
        os.kill(os.getpid(), signal.SIGTERM)
        wait_for(lambda: stop.raised)
        assert stop.raised and stop.signal == signal.SIGTERM
        # A second signal stops at once.
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
            wait_for(lambda: False, timeout_s=1.0)
    assert {sig: signal.getsignal(sig) for sig in before} == before


def test_stop_flag_catches_sigint() -> None:
    before = signal.getsignal(signal.SIGINT)
    with StopFlag() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        wait_for(lambda: stop.raised)
        assert stop.signal == signal.SIGINT
    assert signal.getsignal(signal.SIGINT) is before
