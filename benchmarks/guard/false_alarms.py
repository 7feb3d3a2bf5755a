"""The guard in the demo's regime (lr 1e-3, half the items trained): how often it rolls back a clean
stream, by how much the shadow led over the CUSUM's run when it did (false alarms) or when a fuzz or
flipped-label burst came (true alarms), and what either costs in online accuracy against the unguarded
learner in the same run, for several ``guard.min_drop`` values.

Why: on the saturated 2-core demo (MNIST/MNISTNet, the service's lr 1e-3, about half the items trained)
the guard rolled back a clean stream 1–8 times per 6,000 items with the shadow 8.5–19 points ahead over
the run (stop 34; docs/history.md), above the ``guard.min_drop`` of 5 points chosen at stop 33 from
runs that trained every item. This measures that regime in process, without Kafka or the cores' noise:
:class:`EngineLearner` 1 worker × 1 stage wrapped in :class:`GuardedLearner` as the trainer wraps it,
the label withheld from the learner (predicted, not trained) on all but every ``k``-th item (k = 2: the
demo's share), while the guard still compares the live model and the shadow on every labelled item.
Arms: ``unguarded`` and ``guard`` at each ``--min-drops`` value (every other guard setting the
default). Streams: ``guard_bench.stream`` (MNIST's training split shuffled per seed), clean or with a
fuzz or flipped-label burst of ``--burst`` items at ``--at``. A rollback before the burst (or anywhere on
the clean stream) is a false alarm; the leads they came with bound ``min_drop`` from below, those of the
burst's rollbacks from above.

    flock /tmp/ferret-bench.lock .venv/bin/python -m benchmarks.guard.false_alarms --seeds 0 1 2 \\
        --out benchmarks/guard/results/false_alarms.md
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.guard.guard_bench import stream
from benchmarks.support import short_head
from services.config import load_settings
from services.trainer.engine_learner import EngineLearner
from services.trainer.guard.learner import GuardedLearner
from services.trainer.learner import ArrivalOutcome, Learner
from services.trainer.runner import build_zoo_model
from tests.unit.test_engine_support import make_plan

DROP = re.compile(r"the shadow ([0-9.]+) points above the live model over the run's (\d+) items")


class EveryKth:
    """A learner that trains only every ``k``-th item: the others reach the inner learner unlabelled
    (predicted, not trained), as the items a saturated trainer skips ``busy``. Everything else is the
    inner learner's."""

    def __init__(self, inner: EngineLearner, k: int) -> None:
        self.inner = inner
        self.k = k

    def submit(
        self, item: int, x: torch.Tensor, y: int | None, event_time_ms: int | None = None
    ) -> Callable[[], ArrivalOutcome]:
        return self.inner.submit(item, x, y if item % self.k == 0 else None, event_time_ms)

    def arrive(self, item: int, x: torch.Tensor, y: int | None, event_time_ms: int | None = None) -> ArrivalOutcome:
        return self.submit(item, x, y, event_time_ms)()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@dataclass
class Run:
    scenario: str
    arm: str
    seed: int
    k: int
    correct: list[bool] = field(default_factory=list)
    rollbacks: list[tuple[int, float, int]] = field(default_factory=list)  # item, shadow's lead (points), run items
    trained: int = 0
    seconds: float = 0.0


def run(
    scenario: str, arm: str, min_drop: float | None, seed: int, k: int, data: list[tuple[torch.Tensor, int]], lr: float,
    recall_items: int | None = None,
) -> Run:
    env = {"FERRET_TRAINER_DATASET": "mnist", "FERRET_TRAINER_MODEL": "mnistnet", "FERRET_TRAINER_LR": str(lr),
           "FERRET_TRAINER_TRAINING_THREAD": "loop", "FERRET_TRAINER_PREDICTION_TOP_K": "1"}  # fmt: skip
    if min_drop is None:
        env["FERRET_GUARD_ENABLED"] = "false"
    else:
        env["FERRET_GUARD_MIN_DROP"] = str(min_drop)
        if recall_items is not None:
            env["FERRET_GUARD_RECALL_ITEMS"] = str(recall_items)
    settings = load_settings(None, env=env)
    torch.manual_seed(seed)
    model = build_zoo_model(settings)
    inner = EngineLearner(model, make_plan(1, 1, num_units=model.num_units), settings)
    sampled: Learner = EveryKth(inner, k)  # type: ignore[assignment]
    learner: Learner = GuardedLearner(sampled, model, settings.guard) if min_drop is not None else sampled
    out = Run(scenario, arm, seed, k)
    began = time.perf_counter()
    try:
        for i, (x, y) in enumerate(data):
            outcome = learner.arrive(i, x, y)
            out.correct.append(outcome.predicted_class == y)
            while learner.train_step():
                pass
            if isinstance(learner, GuardedLearner):
                for event in learner.take_events():
                    if event.kind == "rollback":
                        found = DROP.search(event.detail)
                        lead, items = (float(found.group(1)), int(found.group(2))) if found else (float("nan"), 0)
                        out.rollbacks.append((event.item, lead, items))
        out.seconds = time.perf_counter() - began
        out.trained = learner.stats().backward_passes
    finally:
        learner.close()
    return out


def table(runs: list[Run], at: int) -> str:
    lines = [
        "| scenario | k (trained 1 in k) | arm | seed | trained | online acc % | last 1,000 % | Δ vs unguarded "
        "(points) | false rollbacks (before the burst) | burst start → rollback | shadow's lead over the run at "
        "each rollback (points / items) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    base = {(r.scenario, r.seed, r.k): r for r in runs if r.arm == "unguarded"}
    for r in runs:
        acc = 100.0 * float(np.mean(r.correct))
        last = 100.0 * float(np.mean(r.correct[-1000:]))
        ref = base.get((r.scenario, r.seed, r.k))
        delta = "—" if ref is None or ref is r else f"{acc - 100.0 * float(np.mean(ref.correct)):+.2f}"
        guarded = r.arm != "unguarded"
        burst = r.scenario != "clean"
        false = [item for item, _, _ in r.rollbacks if not burst or item < at]
        true = [item - at for item, _, _ in r.rollbacks if burst and item >= at]
        leads = ", ".join(f"{lead:.1f} / {items}" if items else "recurrence rule" for _, lead, items in r.rollbacks)
        cells = [
            r.scenario, r.k, r.arm, r.seed, r.trained, f"{acc:.2f}", f"{last:.1f}", delta,
            len(false) if guarded else "—", (true[0] if true else "none") if guarded and burst else "—", leads or "—",
        ]  # fmt: skip
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--items", type=int, default=6000)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--every", type=int, nargs="+", default=[2], help="train 1 item in k (k values)")
    parser.add_argument("--min-drops", type=float, nargs="+", default=[0.05, 0.15, 0.25])
    parser.add_argument("--recall-items", type=int, nargs="+", default=None,
                        help="guard.recall_items values, each an arm (default: the setting's default only)")
    parser.add_argument("--scenarios", nargs="+", default=["clean", "fuzz", "flip"], choices=["clean", "fuzz", "flip"])
    parser.add_argument("--at", type=int, default=3000, help="where a fuzz or flip burst starts")
    parser.add_argument("--burst", type=int, default=200)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    runs = []
    for seed in args.seeds:
        for scenario in args.scenarios:
            data = stream(seed, args.items, "none" if scenario == "clean" else scenario, args.at, args.burst)
            for k in args.every:
                chosen = [run(scenario, "unguarded", None, seed, k, data, args.lr)]
                for drop in args.min_drops:
                    for recall in args.recall_items or [None]:
                        arm = f"guard, min_drop {drop:g}" + ("" if recall is None else f", recall_items {recall}")
                        chosen.append(run(scenario, arm, drop, seed, k, data, args.lr, recall_items=recall))
                runs.extend(chosen)
                print(table(chosen, args.at), flush=True)
    text = (
        f"# The guard in the demo's regime, MNIST/MNISTNet (commit {short_head()})\n\n"
        f"`{' '.join(['python -m benchmarks.guard.false_alarms', *(argv if argv is not None else sys.argv[1:])])}`"
        f" — {args.items} items, lr {args.lr:g}, seeds {args.seeds}; bursts of {args.burst} at item {args.at}\n\n"
        f"{table(runs, args.at)}\n"
    )
    if args.out is not None:
        args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
