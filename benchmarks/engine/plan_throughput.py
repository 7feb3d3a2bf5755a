"""Does a plan with more workers or stages train more items per second than one unsplit worker, on this
machine (issue 7 part F)?

The planner's R_F assumes every (worker, stage) executor runs in parallel. On the 2-core CPU machine
the executors are threads of one process (one torch thread each, Python's GIL shared with the record
path), so that has to be measured before the live planner is allowed to pick such plans. For each plan
shape (stages × workers, T1 off, chosen among the trainer's own planner's options), the trainer's own
learner (``EngineLearner``: same settings, compensator, admission by event time, memory meter) is fed
MNIST items with ``WallClock.submit`` at an interval well below one worker's service time, so every
plan is saturated; *trained items/s* = items trained / (first measured submit → drained). In the same
process, the plain loop (predict + one SGD step, same model, lr and optimizer) gives the reference.

    .venv/bin/python -m benchmarks.engine.plan_throughput            # → results/plan_throughput.{md,json}
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.engine.service_time import items, plain_loop
from benchmarks.support import short_head, write_result

ROOT = Path(__file__).resolve().parents[2]

RESULTS = Path(__file__).resolve().parent / "results"
SHAPES = ((1, 1), (1, 2), (2, 1), (2, 2))


def settings_for(model: str, dataset: str, profile: str) -> Any:
    from services.config import load_settings

    return load_settings(
        None,
        env={
            "FERRET_TRAINER_DATASET": dataset,
            "FERRET_TRAINER_MODEL": model,
            "FERRET_TRAINER_PROFILE": str(ROOT / "benchmarks" / "profiles" / profile),
            "FERRET_TRAINER_STREAM_RATE": "3000",
        },
    )


def plan_of_shape(settings: Any, stages: int, workers: int) -> Any | None:
    """The trainer's planner's best configuration with ``stages`` stages and ``workers`` live workers (T1 off)."""
    from ferret_core.planning.planner import Planner
    from services.trainer.runner import build_zoo_model, load_profile, make_planner

    base = make_planner(settings, load_profile(settings, build_zoo_model(settings)))
    planner = Planner(base.base_profile, dataclasses.replace(base.settings, max_workers=workers, max_stages=None))
    for option in sorted(planner.options(None), key=planner.rank):
        if option.stages == stages and option.live_workers == workers and not option.recompute:
            point = planner._path(option.index).first_within(None)
            assert point is not None
            return planner._build_plan(option.index, point, None, planner.min_feasible_bytes)
    return None  # the planner has no such configuration (the row is left out)


def run(
    settings: Any, plan: Any, xs: list[torch.Tensor], ys: list[int], interval_s: float, warm: int
) -> dict[str, Any]:
    from services.trainer.engine_learner import EngineLearner
    from services.trainer.runner import build_zoo_model

    torch.manual_seed(0)
    learner = EngineLearner(build_zoo_model(settings), plan, settings)
    clock = learner.clock
    skipped = 0
    t_start = time.perf_counter()
    base_event = time.time()
    futures = []
    try:
        for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
            if i == warm:
                clock.drain(120)
                futures = []
                t_start = time.perf_counter()
            k = i - warm if i >= warm else i
            clock.train_until(t_start + k * interval_s)  # a 1 × 1 CPU plan trains on this thread, as the loop does
            delay = t_start + k * interval_s - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            event = base_event + (time.perf_counter() - t_start)
            futures.append(clock.submit(x, y, index=i, event_time=event))
            clock.predict_queued()  # predicted and dispatched now, as the trainer's record path does (inline)
        skipped = sum(f.result(120).skipped is not None for f in futures)
        clock.drain(120)
        elapsed = time.perf_counter() - t_start
        service = [clock.service_times.service_time(n) for n in range(plan.num_workers)]
    finally:
        learner.close()
    n = len(xs) - warm
    return {
        "plan": f"{plan.num_stages}x{plan.num_workers}",
        "planned_R_F": plan.adaptation_rate,
        "items": n,
        "trained": n - skipped,
        "elapsed_s": elapsed,
        "trained_items_per_s": (n - skipped) / elapsed,
        "service_ms_per_worker": [s * 1000 for s in service],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="mnistnet")
    parser.add_argument("--dataset", default="mnist")
    parser.add_argument("--profile", default="mnistnet.json")
    parser.add_argument("--items", type=int, default=600)
    parser.add_argument("--warm", type=int, default=100)
    parser.add_argument("--interval-ms", type=float, nargs="+", default=[3.4, 1.7], help="1× and 2× of ~290/s")
    parser.add_argument("--out", default="plan_throughput")
    parser.add_argument("--data-root", default=None)
    args = parser.parse_args(argv)

    settings = settings_for(args.model, args.dataset, args.profile)
    torch.set_num_threads(settings.trainer.threads)
    torch.set_flush_denormal(True)
    xs, ys = items(args.items + args.warm, args.data_root, args.dataset)
    load_before = os.getloadavg()
    plain = plain_loop(settings, xs, ys, args.warm)
    plans = [p for p in (plan_of_shape(settings, s, w) for s, w in SHAPES) if p is not None]
    rows = [
        {"interval_ms": ms, **run(settings, plan, xs, ys, ms / 1000, args.warm)}
        for ms in args.interval_ms
        for plan in plans
    ]
    result = {
        "command": " ".join([".venv/bin/python", "-m", "benchmarks.engine.plan_throughput", *(argv or sys.argv[1:])]),
        "commit": short_head(),
        "model": args.model,
        "dataset": args.dataset,
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
                "plain": plain,
        "rows": rows,
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
    }
    print(write_result(RESULTS, args.out, result, render))
    return 0


def render(r: dict[str, Any]) -> str:
    plain = r["plain"]["items_per_s"]
    lines = [
        f"# Items trained per second by plan shape ({r['model']}/{r['dataset']}, {r['cpus']} CPUs, torch threads "
        f"{r['torch_threads']}, commit {r['commit']})",
        "",
        f"Command: `{r['command']}`; every item is predicted (as in the service); load "
        f"average before {tuple(round(x, 2) for x in r['load_average_before'])}, after "
        f"{tuple(round(x, 2) for x in r['load_average_after'])}. Plain loop (predict + SGD step, same process): "
        f"**{plain:.0f} items/s**.",
        "",
        "| interval (arrivals/s) | plan (stages × workers) | planned R_F (profile) | trained items/s | ÷ 1 × 1 "
        "| ÷ plain loop | service ms/item per worker |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in r["rows"]:
        base = next(b for b in r["rows"] if b["interval_ms"] == row["interval_ms"])["trained_items_per_s"]
        per = ", ".join(f"{s:.2f}" for s in row["service_ms_per_worker"])
        lines.append(
            f"| {row['interval_ms']:g} ms ({1000 / row['interval_ms']:.0f}/s) | {row['plan']} "
            f"| {row['planned_R_F']:.0f} | {row['trained_items_per_s']:.0f} "
            f"| {row['trained_items_per_s'] / base:.2f} | {row['trained_items_per_s'] / plain:.2f} | {per} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
