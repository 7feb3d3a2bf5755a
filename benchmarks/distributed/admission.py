"""Admission on executor processes when items come in consumer batches: the queue depth that covers a
fixed 20 ms of delivery spread (the rule before) against one that covers the measured interval between
batches (``services.trainer.process_learner.queue_depth``), in the same run.

MNIST/MNISTNet through the trainer's own ``ProcessLearner`` (1 worker × 1 stage, no guard), in-process (no
Kafka): ``--items`` items handed over in batches of ``--batch`` every ``--pace`` seconds (what a consumer
loop does), each batch predicted and dispatched at once. Reports items trained, skipped ``busy``, the
worker's measured service time and the trained share of what one worker could have trained in the time
(capacity = elapsed ÷ service time).

    flock /tmp/ferret-bench.lock .venv/bin/python -m benchmarks.distributed.admission
"""

from __future__ import annotations

import argparse
import collections
import time
from unittest import mock

import torch

from benchmarks.support import short_head
from ferret_core.data import load_dataset
from ferret_core.data.dataset import normalise
from services.config import load_settings
from services.config.data_root import default_data_root
from services.trainer import process_learner
from services.trainer.executors import ExecutorChoice
from services.trainer.process_learner import ProcessLearner
from services.trainer.runner import build_zoo_model, load_profile, make_planner


def run(items: int, batch: int, pace: float) -> dict[str, float]:
    env = {"FERRET_TRAINER_DATASET": "mnist", "FERRET_TRAINER_MODEL": "mnistnet", "FERRET_TRAINER_EXECUTORS":
           "processes", "FERRET_GUARD_ENABLED": "false"}  # fmt: skip
    settings = load_settings(None, env=env)
    torch.manual_seed(0)
    model = build_zoo_model(settings)
    profile = load_profile(settings, model)
    plan = make_planner(settings, profile, ExecutorChoice("processes", "bench", configured=True)).plan(None)
    learner = ProcessLearner(model, plan, settings, profile)
    ds = load_dataset("mnist", default_data_root(), seed=0)
    xs, ys = normalise(ds.x_train[:items]), [int(y) for y in ds.y_train[:items]]
    counts: collections.Counter[str] = collections.Counter()
    began = time.perf_counter()
    try:
        for start in range(0, items, batch):
            waits = [learner.submit(i, xs[i], ys[i]) for i in range(start, min(start + batch, items))]
            for wait in waits:
                outcome = wait()
                counts["trained" if outcome.skipped is None else outcome.skipped.value] += 1
            time.sleep(pace)
        learner.drain(60)
        elapsed = time.perf_counter() - began
        service = max(t for t in learner.measured_service_times() if t is not None)
    finally:
        learner.close()
    return {"trained": counts["trained"], "busy": counts["busy"], "service_ms": 1e3 * service,
            "elapsed_s": elapsed, "capacity": elapsed / service}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=2400)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--pace", type=float, nargs="+", default=[0.15, 0.3])
    args = parser.parse_args()
    commit = short_head()
    print(f"# Admission of consumer batches on executor processes (commit {commit})\n")
    print(f"MNIST/MNISTNet, 1 × 1 on a worker process, {args.items} items in batches of {args.batch}; one run each.\n")
    print(
        "| batch every | queue depth covers | trained | skipped busy | service ms | trained ÷ worker capacity "
        "| new ÷ old trained |"
    )
    print("|---|---|---:|---:|---:|---:|---:|")
    for pace in args.pace:
        rows = {}
        for rule in ("20 ms (before)", "the measured delivery interval"):
            fixed = rule.startswith("20")
            ceiling = process_learner.DELIVERY_JITTER_S if fixed else process_learner.MAX_DELIVERY_S
            with mock.patch.object(process_learner, "MAX_DELIVERY_S", ceiling):
                rows[rule] = run(args.items, args.batch, pace)
        old = rows["20 ms (before)"]["trained"]
        for rule, r in rows.items():
            ratio = "" if rule.startswith("20") else f"{r['trained'] / max(old, 1):.2f}×"
            print(f"| {pace:g} s | {rule} | {r['trained']:.0f} | {r['busy']:.0f} | {r['service_ms']:.1f} | "
                  f"{r['trained'] / r['capacity']:.2f} | {ratio} |", flush=True)


if __name__ == "__main__":
    main()
