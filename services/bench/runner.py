"""Each run is one ``ferret simulate --json`` process (independent, so ``--jobs K`` uses K cores; one
torch thread each); its JSON report becomes one CSV row. A failed run is recorded in ``failures.log``
with its command and the end of its stderr, never as a row."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ferret_core.engine import METHODS
from ferret_core.errors import FerretError
from services.bench.budgets import Budgets
from services.bench.progress import Progress
from services.bench.specs import RunSpec, Setting

REPO = Path(__file__).resolve().parents[2]
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
MEASURE_TEST_ITEMS = 100  # test items of the budget-M measurement run
DECODED_CACHE = REPO / "out" / "cache"  # decoded images (CIFAR-10 JPEG) kept between runs (git-ignored)
PAPER_COMPENSATOR = "iter-fisher"  # what the paper's Ferret runs (Algorithm 1): pinned for its tables


class RunFailedError(FerretError, RuntimeError):
    """A ``ferret simulate`` run exited with a failure."""


def simulate_argv(
    run: RunSpec,
    budget_bytes: int | None,
    *,
    plan_file: Path | None = None,
    data_root: Path | None = None,
) -> list[str]:
    """The ``ferret simulate`` command of ``run`` (paths absolute, so it runs from anywhere)."""
    arm = run.arm
    argv = [
        sys.executable, "-m", "services.cli.main", "simulate",
        "--dataset", run.setting.dataset,
        "--profile", str(REPO / run.setting.profile),
        "--method", arm.method,
        "--items", str(run.items),
        "--seed", str(run.seed),
        "--lr", f"{run.setting.lr:g}",
        "--cache-dir", str(DECODED_CACHE),
        "--json",
    ]  # fmt: skip
    if run.test_items is not None:
        argv += ["--test-items", str(run.test_items)]
    argv += arm.algorithm_argv()
    if arm.compensator is not None:
        argv += ["--compensator", arm.compensator]
    elif arm.method in METHODS and METHODS[arm.method].compensates:  # the paper's Ferret: Algorithm 1, whatever
        # the CLI's default is (iter-fisher-lean)
        argv += ["--compensator", PAPER_COMPENSATOR]
    if arm.objective != "rate" and plan_file is None:
        argv += ["--objective", arm.objective]
    if plan_file is not None:
        argv += ["--plan", str(plan_file)]
    elif budget_bytes is not None:
        argv += ["--budget", str(budget_bytes)]
    if data_root is not None:
        argv += ["--data-root", str(data_root)]
    return argv


def run_simulate(argv: Sequence[str]) -> dict[str, Any]:
    """Run one simulate process; its JSON report, or :class:`RunFailedError` with its stderr's end."""
    env = {**os.environ, **ONE_THREAD}
    done = subprocess.run(list(argv), cwd=REPO, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-5:])
        raise RunFailedError(f"exit {done.returncode}: {' '.join(argv[2:])}\n{tail}")
    try:
        report: dict[str, Any] = json.loads(done.stdout)
    except json.JSONDecodeError as exc:
        raise RunFailedError(f"{' '.join(argv[2:])} printed no JSON report ({exc}): {done.stdout[:200]!r}") from None
    return report


def row_of(run: RunSpec, budget_bytes: int | None, report: dict[str, Any]) -> dict[str, Any]:
    """The CSV row of a finished run."""
    plan = report.get("plan") or {}
    return {
        "key": run.key,
        "experiment": run.experiment,
        "setting": run.setting.id,
        "dataset": run.setting.dataset,
        "model": run.setting.model,
        "column": run.arm.column,
        "method": run.arm.method,
        "budget": run.arm.budget,
        "budget_bytes": budget_bytes,
        "algorithm": run.arm.algorithm,
        "compensator": report.get("compensator", run.arm.compensator),
        "seed": run.seed,
        "items": report.get("items", run.items),
        "oacc": report["oacc"],
        "tacc": report.get("tacc"),
        "peak_bytes": report.get("peak_bytes"),
        "planned_bytes": report.get("planned_bytes"),
        "adaptation_rate": plan.get("adaptation_rate"),
        "num_stages": report.get("num_stages"),
        "num_workers": report.get("num_workers"),
        "wall_seconds": round(float(report.get("wall_seconds", 0.0)), 3),
        # a stage with no compensated call has no mean: NaN, which the JSON report writes as null
        "relative_correction": ";".join(
            "nan" if v is None else f"{float(v):.6g}" for v in report.get("relative_correction", [])
        ),
        "staleness_histogram": ";".join(
            " ".join(f"{k}:{v}" for k, v in hist.items()) for hist in report.get("staleness_histogram", [])
        ),
    }


def measure_m(
    setting: Setting, items: int, data_root: Path | None, algorithm: str = "vanilla", refresh_every: int | None = None
) -> int:
    """Budget M: the measured peak bytes of PipeDream-2BW on the unconstrained plan's partition (seed 0,
    no compensation) under OCL ``algorithm`` (its replay buffer, teacher or importances included)."""
    from services.bench.specs import Arm

    arm = Arm("pipedream-2bw", "pipedream-2bw", "M+", algorithm, "none", refresh_every=refresh_every)
    # only its memory is read; enough test items that every task of a split-* stream has some (with one,
    # ferret_core.forgetting's per-task matrix raises IndexError)
    run = RunSpec("budget", setting, arm, 0, items, test_items=MEASURE_TEST_ITEMS)
    report = run_simulate(simulate_argv(run, None, data_root=data_root))
    return int(report["peak_bytes"])


def run_pool(
    tasks: Sequence[tuple[str, Callable[[], None]]],
    *,
    jobs: int,
    progress: Progress,
    failures: Path,
) -> int:
    """Run ``tasks`` (name, callable) on ``jobs`` threads (each waits on its process); a task's
    :class:`FerretError` is logged to ``failures`` and counted. Returns the number that failed."""
    before = progress.failed

    def one(task: tuple[str, Callable[[], None]]) -> None:
        name, call = task
        try:
            call()
        except FerretError as exc:
            with failures.open("a") as handle:
                handle.write(f"{name}: {exc}\n")
            progress.advance(failed=True, what=f"FAILED {name}")
        else:
            progress.advance(what=name)

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        list(pool.map(one, tasks))
    return progress.failed - before


def load_budgets(path: Path) -> dict[str, Budgets]:
    if not path.exists():
        return {}
    return {k: Budgets.from_dict(v) for k, v in json.loads(path.read_text()).items()}


def save_budgets(path: Path, budgets: dict[str, Budgets]) -> None:
    path.write_text(json.dumps({k: b.to_dict() for k, b in sorted(budgets.items())}, indent=1) + "\n")
