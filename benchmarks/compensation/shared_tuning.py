"""One λ per stage against one λ per worker: what sharing a compensator's tuning state buys in accuracy.

Since stop 37 every executor process of a stage works on one shared tuning state (Iter-Fisher's λ, v_r,
v_a; DC-ASGD-a's mean square: ``ferret_core/engine/processes/tuning.py``), as the thread engine and the
virtual clock keep one compensator per stage and the paper tunes λ per stage (DESIGN §3.3). Before, each
executor kept its own: with N workers each λ learnt from 1/N of the stage's gradients and a stage applied
N different λ. This measures what that difference costs in online accuracy, on the virtual clock
(deterministic, so the two arms of a seed differ only by the sharing):

* ``stage`` (as shipped): ``ferret simulate`` of Ferret on a fixed multi-worker plan, one compensator per
  stage;
* ``worker`` (the old process executors): the same run, but each stage's compensator switches to worker
  n's own tuning state before it compensates worker n's gradient (each worker's state starts at the
  compensator's initial values: λ⁰, zero EMAs). The deltas of the master's updates stay per stage, as
  they were shared on processes before the tuning state was.

Per setting and compensator: online accuracy of both arms (mean ± s.e. over seeds), the paired difference
stage − worker, the mean relative correction per stage, and the final λ (shared; per worker: min–max).

    PYTHONPATH=$PWD flock /tmp/ferret-bench.lock .venv/bin/python -m benchmarks.compensation.shared_tuning \\
        --settings mnist split-mnist --compensators iter-fisher iter-fisher-lean dc-asgd-a --seeds 5 --jobs 2

``--child -- simulate ...`` is one run of the ``worker`` arm (what the driver starts).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
from torch import Tensor

from benchmarks.compensation.compare import RESULTS, add_run_arguments, mean_se, summary
from benchmarks.compensation.compare import argv as compare_argv
from benchmarks.support import short_head
from ferret_core.compensation import compensator_registry
from ferret_core.compensation.base import StageCompensator
from ferret_core.data import DATASET_NAMES
from ferret_core.engine.stage_update import StageUpdater
from services.bench.runner import run_simulate

COMPENSATORS = ("iter-fisher", "iter-fisher-lean", "dc-asgd-a")  # the ones that learn from gradients
ARMS = ("stage", "worker")


class _Compensating:
    """The worker whose gradient the virtual clock is keeping (it keeps one at a time, on one thread)."""

    worker = 0


@contextlib.contextmanager
def _worker_known() -> Iterator[None]:
    """Record in :class:`_Compensating` which worker each kept gradient comes from."""
    keep = StageUpdater.keep

    def keep_of_worker(self: StageUpdater, worker: int, *args: Any, **kwargs: Any) -> bool:
        _Compensating.worker = worker
        return keep(self, worker, *args, **kwargs)

    StageUpdater.keep = keep_of_worker  # type: ignore[method-assign]
    try:
        yield
    finally:
        StageUpdater.keep = keep  # type: ignore[method-assign]


def per_worker(cls: type[StageCompensator]) -> Callable[..., StageCompensator]:
    """A factory of ``cls`` compensators that keep one tuning state per worker (the ``worker`` arm); the
    built compensators are listed in ``factory.built`` (with their per-worker states)."""

    class PerWorker(cls):  # type: ignore[valid-type, misc]
        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            self.initial = [t.clone() for t in self.tuning_state()]
            self.states: dict[int, list[Tensor]] = {}

        def _compensate(
            self, grads: list[Tensor], staleness: int, theta_then: Sequence[Tensor], theta_now: Sequence[Tensor]
        ) -> list[Tensor]:
            if self.initial:  # the stage can be stale: switch to this worker's λ and EMAs
                n = _Compensating.worker
                state = self.states.setdefault(n, [t.clone() for t in self.initial])
                self._adopt_tuning_state(state)
            out: list[Tensor] = super()._compensate(grads, staleness, theta_then, theta_now)
            return out

        def per_worker(self) -> dict[str, Any]:
            """How many workers kept a state here, and each one's λ (Iter-Fisher; DC-ASGD-a's λ is fixed)."""
            lambdas = {n: float(s[0]) for n, s in sorted(self.states.items()) if s[0].dtype.is_floating_point}
            return {"workers": len(self.states), "lambda": lambdas}

    built: list[Any] = []

    def factory(*args: Any) -> StageCompensator:
        comp = PerWorker(*args)
        built.append(comp)
        return comp

    factory.built = built  # type: ignore[attr-defined]
    return factory


def child(argv: list[str]) -> None:
    """Run ``ferret simulate`` (``argv``) in the ``worker`` arm; print its JSON report with each stage's
    per-worker states added (``per_worker``, per stage: how many workers kept one, and their λ)."""
    from services.cli.main import main as cli_main

    name = argv[argv.index("--compensator") + 1]
    cls = compensator_registry._FACTORIES[name]
    assert isinstance(cls, type), f"{name} has no class to wrap"
    factory = per_worker(cls)
    saved = compensator_registry._FACTORIES[name]
    compensator_registry._FACTORIES[name] = factory
    out = io.StringIO()
    try:
        with _worker_known(), contextlib.redirect_stdout(out):
            code = cli_main(argv)
    finally:
        compensator_registry._FACTORIES[name] = saved
    if code:
        raise SystemExit(code)
    report = json.loads(out.getvalue())
    report["per_worker"] = [comp.per_worker() for comp in factory.built]
    print(json.dumps(report))


def argv(setting: str, compensator: str, arm: str, seed: int, args: argparse.Namespace) -> list[str]:
    """compare.py's simulate command; the ``worker`` arm runs it through this module's ``--child``."""
    command = compare_argv(setting, compensator, seed, args)
    if arm == "worker":
        assert command[1:3] == ["-m", "services.cli.main"], command[:3]
        command[1:3] = ["-m", "benchmarks.compensation.shared_tuning", "--child", "--"]
    return command


def run_one(setting: str, compensator: str, arm: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    report = run_simulate(argv(setting, compensator, arm, seed, args))
    return {
        "setting": setting,
        "compensator": compensator,
        "arm": arm,
        "seed": seed,
        "oacc": report["oacc"],
        "tacc": report["tacc"],
        "relative_correction": report["relative_correction"],
        "lambda": report["lambda"],
        "per_worker": report.get("per_worker"),
        "max_staleness": report["max_staleness"],
        "num_stages": report["num_stages"],
        "num_workers": report["num_workers"],
    }


def _lambda_cell(run: dict[str, Any]) -> str:
    if run["arm"] == "stage":
        return "[" + ", ".join("—" if v is None else f"{v:.9g}" for v in run["lambda"]) + "]"
    cells = []
    for stage in run["per_worker"]:
        values = list(stage["lambda"].values())
        span = "fixed" if not values else f"{min(values):.9g}–{max(values):.9g}"
        cells.append("— (never stale)" if not stage["workers"] else f"{span} ({stage['workers']} states)")
    return "[" + ", ".join(cells) + "]"


def table(rows: list[dict[str, Any]], settings: list[str], compensators: list[str]) -> list[str]:
    lines: list[str] = []
    for setting in settings:
        mine = [r for r in rows if r["setting"] == setting]
        first = mine[0]
        lines += [
            "",
            f"### {setting}: {first['num_stages']} stage(s) × {first['num_workers']} workers, max staleness "
            f"{first['max_staleness']}",
            "",
            "| compensator | tuning state | oacc | stage − worker (paired) | tacc | ‖c‖/‖g‖ per stage "
            "| final λ per stage (seed 0) |",
            "|---|---|---:|---:|---:|---|---|",
        ]
        for c in compensators:
            by_arm = {a: sorted((r for r in mine if r["compensator"] == c and r["arm"] == a), key=lambda r: r["seed"])
                      for a in ARMS}  # fmt: skip
            worker = {r["seed"]: r for r in by_arm["worker"]}
            for arm in ARMS:
                runs = by_arm[arm]
                if not runs:
                    continue
                (o, o_se), (t, t_se), corr = summary(runs)
                diff = "—"
                if arm == "stage":
                    diffs = [r["oacc"] - worker[r["seed"]]["oacc"] for r in runs if r["seed"] in worker]
                    if diffs:
                        d, d_se = mean_se(diffs)
                        diff = f"{d:+.2f} ± {d_se:.2f} (n={len(diffs)})"
                name = "one per stage (shipped)" if arm == "stage" else "one per worker (before stop 37)"
                lines.append(
                    f"| {c} | {name} | {o:.2f} ± {o_se:.2f} | {diff} | {t:.2f} ± {t_se:.2f} | "
                    f"[{', '.join(f'{v:.3g}' for v in corr)}] | {_lambda_cell(runs[0])} |"
                )
    return lines


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        rest = sys.argv[2:]
        child(rest[1:] if rest[:1] == ["--"] else rest)
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--settings", nargs="+", default=["mnist", "split-mnist"], choices=DATASET_NAMES)
    parser.add_argument("--compensators", nargs="+", default=list(COMPENSATORS), choices=COMPENSATORS)
    add_run_arguments(parser)
    parser.add_argument("--name", default="shared_tuning", help="results/<name>.md and .json")
    args = parser.parse_args()
    seeds = range(args.seeds)
    jobs = [(s, c, a, seed) for s in args.settings for c in args.compensators for a in ARMS for seed in seeds]
    with ThreadPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(lambda job: run_one(*job, args), jobs))
    commit = short_head()
    header = [
        f"# One tuning state per stage against one per worker ({args.plan.name}), {args.seeds} seeds paired, "
        f"{args.items} items, lr {args.lr:g}, tacc on {args.test_items} test items",
        "",
        f"Command: `{' '.join(['python -m benchmarks.compensation.shared_tuning', *sys.argv[1:]])}` "
        f"(commit {commit}); the virtual clock, one torch thread per run, {args.jobs} runs at a time.",
    ]
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(rows, indent=1) + "\n")
    lines = header + table(rows, args.settings, args.compensators)
    print("\n".join(lines))
    (RESULTS / f"{args.name}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
