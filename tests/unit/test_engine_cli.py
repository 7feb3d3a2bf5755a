"""``ferret simulate`` on the bundled ``digits`` stream with a synthetic profile (no files, no network)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ferret_core.engine import METHOD_NAMES, METHODS
from ferret_core.engine.trace import from_csv
from ferret_core.profile import LayerProfile, ModelProfile
from services.cli.main import EXIT_INFEASIBLE, main

ITEMS = "80"


@pytest.fixture
def profile(tmp_path: Path) -> Path:
    """The digits MLP (64 → 256 → 128 → 10) with fixed times: a deterministic virtual clock; a step of 20
    items (Camel's default mini-batch with its replayed items) takes 8× one item's, interpolated below."""
    layers = (
        LayerProfile("fc1", 2e-4, 4e-4, params=64 * 256 + 256, activations=256, batch_times=((20, 16e-4, 32e-4),)),
        LayerProfile("fc2", 1e-4, 2e-4, params=256 * 128 + 128, activations=128, batch_times=((20, 8e-4, 16e-4),)),
        LayerProfile("fc3", 5e-5, 1e-4, params=128 * 10 + 10, activations=10, batch_times=((20, 4e-4, 8e-4),)),
    )
    path = tmp_path / "mlp-digits.json"
    ModelProfile("mlp", (1, 8, 8), layers).save(path)
    return path


def simulate(capsys: pytest.CaptureFixture[str], *args: str) -> dict:  # type: ignore[type-arg]
    code = main(["simulate", "--dataset", "digits", "--model", "mlp", "--items", ITEMS, "--json", *args])
    assert code == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("method", ["oracle", "1-skip", "ferret"])
def test_simulate_prints_the_result_and_the_same_seed_gives_the_same_json(
    method: str, profile: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = simulate(capsys, "--method", method, "--profile", str(profile), "--lr", "0.01")
    second = simulate(capsys, "--method", method, "--profile", str(profile), "--lr", "0.01")
    for key in ("oacc", "tacc", "items", "trained", "trained_any_stage", "skipped", "updates_per_stage",
                "peak_bytes", "planned_bytes", "mean_staleness", "lambda", "relative_correction", "wall_seconds"):
        assert key in first
    assert first["items"] == 80 and first["tacc"] is not None
    first.pop("wall_seconds"), second.pop("wall_seconds")
    assert first == second
    if method == "ferret":
        assert first["planned_bytes"] == first["plan"]["planned_bytes"] and first["num_workers"] > 1
    else:  # sequential: planned bytes from the schedules' byte model, never stale, no compensator
        assert first["planned_bytes"] > 0 and first["plan"] is None and first["compensator"] == "none"
    if method == "1-skip":
        assert first["skipped"]["busy"] > 0


def test_simulate_writes_the_trace_and_a_readable_report(
    profile: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "trace.csv"
    code = main(["simulate", "--dataset", "digits", "--model", "mlp", "--items", "30", "--method", "ferret",
                 "--compensator", "iter-fisher", "--profile", str(profile), "--trace", str(trace)])
    assert code == 0
    out = capsys.readouterr().out
    assert "online accuracy" in out and "measured peak" in out and "λ" in out
    events = from_csv(trace.read_text())
    assert {e.kind.value for e in events} >= {"F", "B", "U"}


def test_an_infeasible_budget_exits_3(profile: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["simulate", "--dataset", "digits", "--model", "mlp", "--items", "10", "--method", "ferret",
                 "--profile", str(profile), "--budget", "1000"])
    assert code == EXIT_INFEASIBLE
    assert "minimum feasible" in capsys.readouterr().err


@pytest.mark.parametrize("method", METHOD_NAMES)
def test_simulate_accepts_every_registered_method(
    method: str, profile: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = simulate(capsys, "--method", method, "--profile", str(profile))
    assert out["method"] == method and out["items"] == 80
    assert out["trained_any_stage"] + sum(out["skipped"].values()) == 80
    assert out["peak_bytes"] > 0 and out["planned_bytes"] > 0
    assert out["compensator"] == ("iter-fisher-lean" if method == "ferret" else "none")  # the default
    assert (out["plan"] is not None) == METHODS[method].needs_plan


def test_simulate_flush_every_and_an_asked_compensator(profile: Path, capsys: pytest.CaptureFixture[str]) -> None:
    default = simulate(capsys, "--method", "dapple", "--profile", str(profile))
    longer = simulate(capsys, "--method", "dapple", "--profile", str(profile), "--flush-every", "6")
    assert longer["flush_every"] == 6 and sum(longer["updates_per_stage"]) < sum(default["updates_per_stage"])
    asked = simulate(capsys, "--method", "pipedream", "--profile", str(profile), "--compensator", "fisher")
    assert asked["compensator"] == "fisher"


def test_the_cli_lists_names_from_the_core_registries() -> None:
    from ferret_core.compensation import COMPENSATOR_NAMES
    from ferret_core.zoo import MODEL_NAMES
    from services.cli.main import build_parser

    parser = build_parser()
    simulate_parser = parser._subparsers._group_actions[0].choices["simulate"]  # type: ignore[union-attr]
    choices = {a.dest: a.choices for a in simulate_parser._actions if a.choices}
    helps = {a.dest: a.help or "" for a in simulate_parser._actions}
    assert tuple(choices["method"]) == METHOD_NAMES
    assert tuple(choices["compensator"]) == COMPENSATOR_NAMES
    assert ", ".join(MODEL_NAMES) in helps["model"]  # a zoo name or your own factory: listed, not enforced
