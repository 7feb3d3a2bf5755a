"""``ferret plan``: JSON schema, exit statuses and the readable table."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from ferret_core.profile import ModelProfile
from services.cli.main import EXIT_INFEASIBLE, EXIT_USAGE, main
from services.units import parse_bytes

from .planner_fixtures import GOLDEN_A_UNITS, profile_from

REQUIRED_KEYS = {
    "stages",
    "workers",
    "num_workers",
    "live_workers",
    "planned_bytes",
    "paper_memory_elements",
    "adaptation_rate",
    "min_feasible_bytes",
    "arrival_interval",
    "stage_forward_time",
    "stage_backward_time",
    "decay",
}


@pytest.fixture
def profile_file(tmp_path: Path) -> Path:
    # golden case (a)'s units under the name and input shape of the zoo's MNISTNet (a profile taken at
    # another input shape is refused)
    profile = dataclasses.replace(profile_from(GOLDEN_A_UNITS, name="mnistnet"), input_shape=(1, 28, 28))
    path = tmp_path / "mnistnet.json"
    profile.save(path)
    return path


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, object]:
    assert main(["plan", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def test_json_schema(profile_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(capsys, "--model", "mnistnet", "--profile", str(profile_file), "--arrival-interval", "3")
    assert out.keys() >= REQUIRED_KEYS
    assert out["stages"] == [[0], [1], [2, 3]]
    workers = out["workers"]
    assert isinstance(workers, list) and len(workers) == out["num_workers"] == 3
    for worker in workers:
        assert {"delay", "recompute", "accumulation", "omission"} <= worker.keys()
        assert len(worker["accumulation"]) == len(worker["omission"]) == 3
    assert out["arrival_interval"] == 3.0


def test_json_round_trips_into_a_plan(profile_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ferret_core.plan import Plan

    out = run_json(capsys, "--model", "mnistnet", "--profile", str(profile_file), "--budget", "40MiB")
    plan = Plan.from_dict(out)
    assert plan.to_dict() == out
    assert plan.planned_bytes <= 40 * 2**20


def test_budget_below_minimum_exits_3_with_the_minimum(profile_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["plan", "--model", "mnistnet", "--profile", str(profile_file), "--budget", "1KB"])
    assert status == EXIT_INFEASIBLE
    err = capsys.readouterr().err
    minimum = run_json(capsys, "--model", "mnistnet", "--profile", str(profile_file))["min_feasible_bytes"]
    assert str(minimum) in err


def test_usage_errors_exit_2(profile_file: Path) -> None:
    for argv in (
        ["plan", "--model", "mnistnet", "--profile", str(profile_file), "--budget", "lots"],
        ["plan", "--model", "nope"],
        ["plan", "--model", "mnistnet", "--arrival-interval", "-1"],
    ):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == EXIT_USAGE


def test_profile_for_another_model_is_an_error(profile_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", "convnet", "--profile", str(profile_file)]) == 1
    assert "is for model 'mnistnet'" in capsys.readouterr().err


def test_readable_table_explains_the_techniques(profile_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(capsys, "--model", "mnistnet", "--profile", str(profile_file))
    budget = (int(out["planned_bytes"]) + int(out["min_feasible_bytes"])) // 2  # type: ignore[call-overload]
    assert main(["plan", "--model", "mnistnet", "--profile", str(profile_file), "--budget", str(budget)]) == 0
    text = capsys.readouterr().out
    assert "why:" in text and "T1 (activation recomputation)" in text
    assert any(kind in text for kind in ("S2 worker", "S3 worker", "S4 worker"))


def test_arrival_interval_multiple(profile_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    profile = ModelProfile.load(profile_file)
    out = run_json(capsys, "--model", "mnistnet", "--profile", str(profile_file), "--arrival-interval", "2x")
    assert out["arrival_interval"] == 2 * profile.max_forward_time


@pytest.mark.parametrize(
    ("text", "value"), [("512MiB", 512 * 2**20), ("2GB", 2 * 10**9), ("2429288", 2429288), ("1.5KiB", 1536)]
)
def test_parse_bytes(text: str, value: int) -> None:
    assert parse_bytes(text) == value


def test_console_script_runs(profile_file: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "services.cli.main", "plan", "--model", "mnistnet", "--profile", str(profile_file)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "Plan for mnistnet" in result.stdout


def test_the_default_compensator_is_the_lean_variant(profile_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``iter-fisher-lean`` is the planner's default (Iter-Fisher's accuracy at 20 % of its state bytes,
    docs/planner.md): no delta ring is counted; ``--compensator iter-fisher`` (Algorithm 1)
    still counts its ring."""
    common = ("--model", "mnistnet", "--profile", str(profile_file), "--arrival-interval", "3")
    lean = run_json(capsys, *common)
    algorithm_1 = run_json(capsys, *common, "--compensator", "iter-fisher")
    assert "compensator_ring" not in lean["memory_breakdown"]  # type: ignore[operator]
    assert "compensator_ring" in algorithm_1["memory_breakdown"]  # type: ignore[operator]
    assert lean["planned_bytes"] < algorithm_1["planned_bytes"]  # type: ignore[operator]


def test_a_plan_document_from_before_the_rename_still_reads(
    profile_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Snapshots and saved ``--json`` plans written when the planned bytes were called ``predicted_bytes``."""
    from ferret_core.plan import Plan

    out = run_json(capsys, "--model", "mnistnet", "--profile", str(profile_file), "--budget", "40MiB")
    old = {("predicted_bytes" if key == "planned_bytes" else key): value for key, value in out.items()}
    assert "planned_bytes" not in old
    assert Plan.from_dict(old) == Plan.from_dict(out)


def test_plan_model_profiles_as_ferret_profile_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``ferret plan --model`` (no --profile) and ``ferret profile`` time the units with the same settings:
    one torch thread whatever the process had (2 here), the same clock, warm-up, repeats and batch. Before,
    plan profiled on torch's default threads on the wall clock: MNISTNet's t^d came out 90× the profile's.
    The settings are read where the core's profiler is called, and from the profiles it returns."""
    import torch

    from ferret_core.planning import profiler

    calls: list[dict[str, object]] = []
    real = profiler.profile_model

    def spy(model: object, **kwargs: object) -> ModelProfile:
        profile = real(model, **kwargs)  # type: ignore[arg-type]
        kwargs.pop("progress", None)  # ferret profile's progress line is its own
        meta = (profile.meta["threads"], profile.meta["clock"], profile.meta["warmup"], profile.meta["repeats"])
        calls.append({"threads_at_call": torch.get_num_threads(), "meta": meta, **kwargs})
        return profile

    monkeypatch.setattr(profiler, "profile_model", spy)
    torch.set_num_threads(2)  # torch's default on a 2-core machine, which plan used to profile with
    try:
        assert main(["profile", "--model", "mlp", "--out", str(tmp_path / "mlp.json")]) == 0
        assert torch.get_num_threads() == 2  # pinned while profiling only
        assert main(["plan", "--model", "mlp", "--json"]) == 0
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(1)  # tests/conftest.py's
    capsys.readouterr()
    from_profile, from_plan = calls
    assert from_plan == from_profile
    assert from_plan["threads_at_call"] == 1 and from_plan["meta"] == (1, "cpu", 3, 10)


def test_plans_for_several_hosts_print_each_hosts_bytes(profile_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--profile", str(profile_file), "--hosts", "3", "--json"]) == 0
    free = json.loads(capsys.readouterr().out)
    assert len(free["host_bytes"]) == 3 and free["num_stages"] <= 2  # a stage per serving host
    assert main(["plan", "--profile", str(profile_file), "--hosts", "3"]) == 0
    assert "planned bytes per host: rank 0 " in capsys.readouterr().out
    budget = str(max(free["host_bytes"]) - 1)
    assert main(["plan", "--profile", str(profile_file), "--hosts", "3", "--host-budget", budget, "--json"]) == 0
    assert max(json.loads(capsys.readouterr().out)["host_bytes"]) <= int(budget)
    assert main(["plan", "--profile", str(profile_file), "--hosts", "3", "--host-budget", "10"]) == EXIT_INFEASIBLE
    assert "raise the per-host budget to at least" in capsys.readouterr().err
    assert main(["plan", "--profile", str(profile_file), "--host-budget", "1GB"]) == 1
    assert "--hosts H" in capsys.readouterr().err
