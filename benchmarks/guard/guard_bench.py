"""The guard under a poisoning burst and under a genuine drift, on a real MNIST/MNISTNet stream.

In-process through the trainer's own learner classes (no Kafka): :class:`EngineLearner` (1 worker × 1
stage, trained on the caller's thread, each item predicted then trained before the next: a prequential
stream with no skipped items), wrapped in :class:`GuardedLearner` exactly as ``make_learner`` wraps it in
the trainer. The stream is MNIST's training split through the dataset registry (``load_dataset("mnist")``),
shuffled per seed, ``--items`` long; from item ``--at`` on, one scenario:

* ``fuzz``: ``--burst`` items of fuzz inputs (each pixel uniform in [0, 1], half of them set to ±1000:
  the in-range extremes of docs/reliability.md) with random labels, then the clean stream again;
* ``flip``: ``--burst`` items whose labels are flipped (y → (y + 1) mod 10), then the true labels again;
* ``drift``: a genuine, lasting drift: every label from ``--at`` on permuted (a fixed permutation with no
  fixed point), the new mapping being the truth from then on.

Arms: ``unguarded`` (``guard.enabled: false``, ``guard.max_step_ratio: null``: the trainer before the
guard), ``norm-only`` (the norm guard at its default, no shadow; fuzz only), ``guard-cusum-only`` (the
guard of commit 9dad031: the CUSUM as the only rollback rule, every passing window on probation:
``guard.recurrence_level: 0``, ``guard.probation: always``), ``guard`` (the defaults: norm guard, shadow,
CUSUM rollback, the recurrence rule with its recall test, probation for suspect windows, ADWIN),
``guard-no-recall`` (the defaults without the recall test, ``guard.recall_items: 0``: the guard before
stop 40), and for ``flip`` the
counterfactual ``rollback-at-end``: the unguarded learner whose pre-burst weights (those of item ``--at``)
are put back the moment the burst ends — a rollback that knows exactly when the burst began and ended,
which no rule can: what the best possible rollback would have bought, beside what the guard did.
Accuracy is scored against the label the stream gives (for fuzz items a random one; for ``drift`` the
permuted one). A prediction the learner refuses as non-finite
(``ModelDivergedError``: the trainer dead-letters it instead of publishing a NaN confidence) counts as a
NaN prediction and as wrong.

    flock /tmp/ferret-bench.lock .venv/bin/python -m benchmarks.guard.guard_bench --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from benchmarks.support import short_head
from ferret_core.data import load_dataset
from ferret_core.data.dataset import normalise
from services.config import load_settings
from services.config.data_root import default_data_root
from services.trainer.engine_learner import EngineLearner
from services.trainer.guard.learner import GuardedLearner
from services.trainer.learner import Learner, ModelDivergedError
from services.trainer.runner import build_zoo_model
from tests.unit.test_engine_support import make_plan

ARMS = {
    "unguarded": {"FERRET_GUARD_ENABLED": "false", "FERRET_GUARD_MAX_STEP_RATIO": "null"},
    "norm-only": {"FERRET_GUARD_ENABLED": "false"},
    "guard-cusum-only": {"FERRET_GUARD_PROBATION": "always", "FERRET_GUARD_RECURRENCE_LEVEL": "0"},
    "guard-no-recall": {"FERRET_GUARD_RECALL_ITEMS": "0"},
    "guard": {},
    "rollback-at-end": {"FERRET_GUARD_ENABLED": "false", "FERRET_GUARD_MAX_STEP_RATIO": "null"},
}
COUNTERFACTUAL = "rollback-at-end"  # an unguarded learner given the pre-burst weights back at the burst's end
SCENARIO_ARMS = {
    "fuzz": list(ARMS),
    "flip": ["unguarded", "guard-cusum-only", "guard-no-recall", "guard", "rollback-at-end"],
    "drift": ["unguarded", "guard-cusum-only", "guard-no-recall", "guard"],
}
WINDOW = 100


@dataclass
class Run:
    scenario: str
    arm: str
    seed: int
    correct: list[bool] = field(default_factory=list)
    nan: int = 0
    rollbacks: list[int] = field(default_factory=list)  # items of the rollbacks
    drifts: list[int] = field(default_factory=list)  # items of the drift events
    seconds: float = 0.0
    shadow_ms: float = 0.0  # the shadow's forward per compared item

    def per_window(self) -> list[float]:
        return [100.0 * float(np.mean(self.correct[i : i + WINDOW])) for i in range(0, len(self.correct), WINDOW)]


def stream(seed: int, items: int, scenario: str, at: int, burst: int) -> list[tuple[torch.Tensor, int]]:
    ds = load_dataset("mnist", default_data_root(), seed=seed)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(ds.y_train))[:items]
    xs, ys = normalise(ds.x_train[order]), [int(y) for y in ds.y_train[order]]
    perm = (np.arange(10) + 1 + rng.integers(9)) % 10  # a cyclic shift by 1..9: no fixed point
    out = []
    for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
        if scenario == "fuzz" and at <= i < at + burst:
            fuzz = rng.uniform(0, 1, x.shape).astype(np.float32)
            mask = rng.random(x.shape) < 0.5
            fuzz[mask] = rng.choice([1000.0, -1000.0], int(mask.sum()))
            x, y = torch.from_numpy(fuzz), int(rng.integers(10))
        elif scenario == "flip" and at <= i < at + burst:
            y = (y + 1) % 10
        elif scenario == "drift" and i >= at:
            y = int(perm[y])
        out.append((x, y))
    return out


def run(
    scenario: str, arm: str, seed: int, data: list[tuple[torch.Tensor, int]], lr: float, at: int, burst: int
) -> Run:
    env = {"FERRET_TRAINER_DATASET": "mnist", "FERRET_TRAINER_MODEL": "mnistnet", "FERRET_TRAINER_LR": str(lr),
           "FERRET_TRAINER_TRAINING_THREAD": "loop", "FERRET_TRAINER_PREDICTION_TOP_K": "1", **ARMS[arm]}  # fmt: skip
    settings = load_settings(None, env=env)
    torch.manual_seed(seed)
    model = build_zoo_model(settings)
    inner = EngineLearner(model, make_plan(1, 1, num_units=model.num_units), settings)
    learner: Learner = GuardedLearner(inner, model, settings.guard) if settings.guard.enabled else inner
    out = Run(scenario, arm, seed)
    began = time.perf_counter()
    pre_burst: dict[str, torch.Tensor] = {}
    try:
        for i, (x, y) in enumerate(data):
            if arm == COUNTERFACTUAL and i == at:
                pre_burst = {k: v.clone() for k, v in learner.state_tensors().items()}
            elif arm == COUNTERFACTUAL and i == at + burst:
                learner.load_state_tensors(pre_burst)
                out.rollbacks.append(i)
            try:
                outcome = learner.arrive(i, x, y)
                ok = math.isfinite(outcome.confidence)
                out.nan += not ok
                out.correct.append(ok and outcome.predicted_class == y)
            except ModelDivergedError:
                out.nan += 1
                out.correct.append(False)
            while learner.train_step():
                pass
            if isinstance(learner, GuardedLearner):
                for event in learner.take_events():
                    if event.kind == "rollback":
                        out.rollbacks.append(event.item)
                    elif event.kind == "drift":
                        out.drifts.append(event.item)
        out.seconds = time.perf_counter() - began
        guard = learner.stats().guard
        if guard is not None and guard.shadow_items:
            out.shadow_ms = 1e3 * guard.shadow_seconds / guard.shadow_items
    finally:
        learner.close()
    return out


def recovery(r: Run, at: int, burst: int, level: float) -> int | None:
    """Items from the burst's start to the end of the first 100-item window after the burst whose
    accuracy is back at ``level`` (None: never within the stream)."""
    for end in range(at + burst + WINDOW, len(r.correct) + 1):
        if 100.0 * float(np.mean(r.correct[end - WINDOW : end])) >= level:
            return end - at
    return None


def summarise(runs: list[Run], at: int, burst: int) -> str:
    columns = [
        "scenario", "arm", "seed", "pre-burst acc % (500 items)", "burst start → rollback (items)",
        "rollbacks before the burst", "burst start → back to pre-burst level (items)",
        "acc % of the 500 after the burst", "acc % of the last 500", "NaN predictions",
        "drift detected after (items)", "s per 1,000 items", "shadow ms / item",
    ]  # fmt: skip
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in runs:
        level = 100.0 * float(np.mean(r.correct[at - 500 : at]))
        after = [i - at for i in r.rollbacks if i >= at]
        before = sum(1 for i in r.rollbacks if i < at)
        end = at + (burst if r.scenario != "drift" else 0)
        back = recovery(r, at, end - at, level)
        after_burst = 100.0 * float(np.mean(r.correct[end : end + 500]))
        drift = [i - at for i in r.drifts if i >= at]
        guarded = r.arm.startswith("guard")
        none = "none" if guarded else "—"
        before_cell: object = before if guarded else "—"
        if r.arm == COUNTERFACTUAL:
            guarded, before_cell = True, 0  # its one rollback is the restore at the burst's end
        cells = [
            r.scenario, r.arm, r.seed, f"{level:.1f}", after[0] if after else none, before_cell,
            back if back is not None else "not within the stream", f"{after_burst:.1f}",
            f"{100.0 * float(np.mean(r.correct[-500:])):.1f}",
            r.nan, drift[0] if drift else none, f"{1e3 * r.seconds / len(r.correct):.1f}",
            f"{r.shadow_ms:.2f}" if r.arm.startswith("guard") else "—",
        ]  # fmt: skip
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def curves(runs: list[Run], seed: int) -> str:
    out = []
    for scenario in SCENARIO_ARMS:
        chosen = [r for r in runs if r.scenario == scenario and r.seed == seed]
        if not chosen:
            continue
        out.append(f"\n**{scenario}**, seed {seed}: online accuracy % per {WINDOW} items\n")
        out.append("| items | " + " | ".join(r.arm for r in chosen) + " |")
        out.append("|---|" + "---|" * len(chosen))
        for w, values in enumerate(zip(*(r.per_window() for r in chosen), strict=True)):
            out.append(f"| {w * WINDOW}–{(w + 1) * WINDOW} | " + " | ".join(f"{v:.0f}" for v in values) + " |")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--items", type=int, default=3000)
    parser.add_argument("--at", type=int, default=1500)
    parser.add_argument("--burst", type=int, default=200)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--scenarios", nargs="+", default=list(SCENARIO_ARMS))
    parser.add_argument("--arms", nargs="+", default=None, choices=list(ARMS), help="only these (default: all)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    commit = short_head()
    runs = []
    for seed in args.seeds:
        for scenario in args.scenarios:
            data = stream(seed, args.items, scenario, args.at, args.burst)
            for arm in [a for a in SCENARIO_ARMS[scenario] if args.arms is None or a in args.arms]:
                runs.append(run(scenario, arm, seed, data, args.lr, args.at, args.burst))
                print(f"{scenario} {arm} seed {seed}: {runs[-1].seconds:.1f} s", flush=True)
    report = "\n".join([
        f"# Guard benchmark (commit {commit})\n",
        f"Command: `python -m benchmarks.guard.guard_bench {' '.join(sys.argv[1:])}`\n",
        f"MNIST/MNISTNet, {args.items} items, lr {args.lr}, event at item {args.at}, burst {args.burst} items, "
        f"seeds {args.seeds}; torch threads 1.\n",
        summarise(runs, args.at, args.burst),
        curves(runs, args.seeds[0]),
    ])
    print(report)
    if args.out is not None:
        args.out.write_text(report + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
