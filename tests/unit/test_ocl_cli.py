"""``ferret simulate --method random-n/last-n/camel --algorithm NAME`` on the bundled ``digits`` stream and on
a split (task) version of it, with a synthetic profile that has mini-batch times."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ferret_core.engine import METHOD_NAMES
from ferret_core.ocl import ALGORITHM_NAMES, make_algorithm
from ferret_core.profile import LayerProfile, ModelProfile
from services.cli.main import EXIT_INFEASIBLE, build_parser, main
from services.cli.simulate_cmd import algorithm_settings, step_batch_sizes


@pytest.fixture
def profile(tmp_path: Path) -> Path:
    """The digits MLP with fixed times for 1, 10, 20 and 50 items per step."""

    def layer(name: str, t_f: float, t_b: float, params: int, activations: int) -> LayerProfile:
        times = tuple((b, t_f * (1 + 0.5 * b), t_b * (1 + 0.5 * b)) for b in (10, 20, 50))
        return LayerProfile(name, t_f, t_b, params=params, activations=activations, saved=activations,
                            batch_times=times)

    layers = (
        layer("fc1", 2e-4, 4e-4, 64 * 256 + 256, 256),
        layer("fc2", 1e-4, 2e-4, 256 * 128 + 128, 128),
        layer("fc3", 5e-5, 1e-4, 128 * 10 + 10, 10),
    )
    path = tmp_path / "mlp-digits.json"
    ModelProfile("mlp", (1, 8, 8), layers).save(path)
    return path


def simulate(capsys: pytest.CaptureFixture[str], *args: str) -> dict:  # type: ignore[type-arg]
    code = main(["simulate", "--model", "mlp", "--json", "--lr", "0.05", *args])
    assert code == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("method", ["random-n", "last-n", "camel"])
def test_buffering_methods(method: str, profile: Path, capsys: pytest.CaptureFixture[str]) -> None:
    r = simulate(capsys, "--dataset", "digits", "--items", "120", "--method", method, "--profile", str(profile),
                 "--camel-buffer", "50")
    assert r["method"] == method and r["items"] == 120 == r["trained"] + sum(r["skipped"].values())
    assert r["skipped"]["not_selected"] > 0 and r["planned_bytes"] > 0 and r["peak_bytes"] > 0
    assert r["task_accuracy"] is None  # digits has no tasks


@pytest.mark.parametrize("algorithm", ALGORITHM_NAMES)
def test_algorithms_under_ferret_and_last_n(algorithm: str, profile: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for method in ("ferret", "last-n"):
        r = simulate(capsys, "--dataset", "split-digits", "--items", "100", "--method", method,
                     "--algorithm", algorithm, "--profile", str(profile),
                     "--replay-buffer", "40", "--lwf-every", "20", "--mas-every", "10")
        assert r["algorithm"] == algorithm
        assert r["items"] == 100 == r["trained_any_stage"] + sum(r["skipped"].values())
        tasks = r["task_accuracy"]
        assert tasks["after_task"] == [0, 1, 2, 3, 4] and len(tasks["accuracy"][0]) == 5
        assert tasks["forgetting"] is not None
        if algorithm in ("er", "mir") and method == "ferret":
            assert r["plan"]["memory_breakdown"]["replay_buffer"] == 40 * 64 * 4
        if algorithm != "vanilla":
            assert r["memory_breakdown"]["algorithm"] > 0


def test_every_registered_name_is_accepted(profile: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert {"random-n", "last-n", "camel"} <= set(METHOD_NAMES)
    with pytest.raises(SystemExit):
        main(["simulate", "--dataset", "digits", "--model", "mlp", "--method", "oracle", "--algorithm", "ewc"])


def test_camel_refuses_an_algorithm(profile: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["simulate", "--dataset", "digits", "--model", "mlp", "--items", "10", "--method", "camel",
                 "--algorithm", "er", "--profile", str(profile)])
    assert code != 0 and "camel" in capsys.readouterr().err


def test_budget_fits_the_mini_batch_or_exits_3(profile: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = simulate(capsys, "--dataset", "digits", "--items", "60", "--method", "last-n", "--profile", str(profile))
    fitted = simulate(capsys, "--dataset", "digits", "--items", "60", "--method", "last-n", "--profile", str(profile),
                      "--budget", str(base["planned_bytes"]))
    assert fitted["planned_bytes"] <= base["planned_bytes"]
    code = main(["simulate", "--dataset", "digits", "--model", "mlp", "--items", "10", "--method", "last-n",
                 "--profile", str(profile), "--budget", str(base["planned_bytes"] - 1)])
    assert code == EXIT_INFEASIBLE and "minimum feasible" in capsys.readouterr().err


@pytest.mark.parametrize(("method", "algorithm", "sizes"), [
    ("last-n", "er", (1, 4, 8)),  # N = 4, plus 4 replayed
    ("camel", "vanilla", (1, 6)),  # N = 4 coreset + 2 replayed
    ("oracle", "mir", (1, 2, 5)),  # 1 + 1 replayed; 5 candidates scored
])
def test_profiling_now_times_the_steps_batch_sizes(method: str, algorithm: str, sizes: tuple[int, ...]) -> None:
    args = build_parser().parse_args(["simulate", "--dataset", "digits", "--model", "mlp", "--method", method,
                                          "--algorithm", algorithm, "--bskip-batch", "4", "--camel-replay", "2"])
    assert step_batch_sizes(args, make_algorithm(algorithm, algorithm_settings(args))) == sizes


def test_simulate_without_a_profile_profiles_the_mini_batches(capsys: pytest.CaptureFixture[str]) -> None:
    r = simulate(capsys, "--dataset", "digits", "--items", "30", "--method", "last-n", "--algorithm", "er",
                 "--bskip-batch", "4", "--replay-buffer", "20")
    assert r["items"] == 30 == r["trained"] + sum(r["skipped"].values()) and r["trained"] > 0
