"""Where the live trainer's per-item training time goes (issue 7 part E), without Kafka.

The trainer's own learner (``EngineLearner``: the same settings, planner, plan, engine options and
started ``WallClock`` as ``ferret run``) is fed MNIST items with ``WallClock.submit`` at a fixed
interval (with event times, so the event-time admission rule decides as in the service), and every
segment of the executor's work is timed with ``time.perf_counter_ns`` by wrapping the pipeline's
methods: the F and B actions as the admission rule's ``ServiceTimes`` sees them, and inside them the
forward with grad, backward, compensation, update (optimizer step, publish), the memory meter's
sample, and the lock waits. In the same process and with the same torch threads, a plain loop
(predict + one SGD step on the same model, lr and optimizer) gives the reference service time.

    .venv/bin/python -m benchmarks.engine.service_time                  # → results/service_time.{md,json}
    .venv/bin/python -m benchmarks.engine.service_time --items 400 --interval-ms 20 --out NAME

Read: *service ms/item* = the wall time of an item's F and B actions (what ``ServiceTimes`` measures, the
admission rule's service time); *engine items/s* = trained items / elapsed of a back-to-back run (interval
0, admission off: what one worker trains when it never waits); the ratio columns divide the plain loop's
numbers by the engine's.
"""

from __future__ import annotations

import argparse
import collections
import functools
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from benchmarks.support import short_head, write_result

ROOT = Path(__file__).resolve().parents[2]

RESULTS = Path(__file__).resolve().parent / "results"

_times: dict[str, list[int]] = collections.defaultdict(list)
_tls = threading.local()


def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter_ns()
        try:
            return fn(*args, **kwargs)
        finally:
            _times[name].append(time.perf_counter_ns() - t0)

    return wrapper


def instrument() -> None:
    """Wrap the pipeline's segments (module-level functions it imported, and its and its parts' methods)."""
    from ferret_core.engine import memory_meter, pipeline, predictor, stage_update, wall_clock

    P = pipeline.Pipeline
    for name in (
        "execute",
        "_forward",
        "_backward",
        "_offer_gradient",
        "_after_gradient",
        "_update",
        "_finish_item",
        "_record",
        "dispatch",
        "pull",
    ):
        setattr(P, name, timed(name, getattr(P, name)))
    U = stage_update.StageUpdater
    for name, method in (("_compensate", "compensate"), ("_apply", "apply")):
        setattr(U, method, timed(name, getattr(U, method)))
    for name in ("predict_top_k", "predict_top_k_batch"):
        setattr(predictor.Predictor, name, timed(name, getattr(predictor.Predictor, name)))
    for name in ("forward_with_grad", "forward_no_grad", "backward"):
        setattr(pipeline, name, timed(name, getattr(pipeline, name)))
    stage_update.all_finite = timed("all_finite", stage_update.all_finite)  # type: ignore[assignment]
    meter = memory_meter.MemoryMeter
    meter.sample = timed("meter.sample", meter.sample)  # type: ignore[method-assign]
    vs = pipeline.VersionStore
    for name in ("publish", "refresh", "recycled"):
        setattr(vs, name, timed(f"store.{name}", getattr(vs, name)))
    del wall_clock


def settings_for(
    model: str, rate: float, compensator: str | None, measure_memory: bool, dataset: str = "mnist",
    profile: str | None = None,
) -> Any:
    from services.config import load_settings

    env = {
        "FERRET_TRAINER_DATASET": dataset,
        "FERRET_TRAINER_MODEL": model,
        "FERRET_TRAINER_PROFILE": str(ROOT / "benchmarks" / "profiles" / (profile or f"{model}.json")),
        "FERRET_TRAINER_STREAM_RATE": str(rate),
    }
    if compensator:
        env["FERRET_TRAINER_COMPENSATOR"] = compensator
    return load_settings(None, env=env)


def items(n: int, root: str | None, dataset: str = "mnist") -> tuple[list[torch.Tensor], list[int]]:
    from ferret_core.data import load_dataset, normalise

    if not root:  # the service's default (imports its config package: Kafka, protobuf)
        from services.config.data_root import default_data_root

        root = str(default_data_root())
    data = load_dataset(dataset, Path(root))
    xs = [normalise(np.asarray(data.x_train[i])) for i in range(n)]
    return xs, [int(data.y_train[i]) for i in range(n)]


def plain_loop(settings: Any, xs: list[torch.Tensor], ys: list[int], warm: int) -> dict[str, float]:
    from services.trainer.runner import build_zoo_model

    torch.manual_seed(0)
    model = build_zoo_model(settings).as_sequential()
    opt = torch.optim.SGD(model.parameters(), lr=settings.trainer.lr)
    predict_ns, train_ns = [], []
    for x, y in zip(xs, ys, strict=True):
        t0 = time.perf_counter_ns()
        with torch.no_grad():
            int(model(x.unsqueeze(0)).argmax(1).item())
        t1 = time.perf_counter_ns()
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x.unsqueeze(0)), torch.tensor([y])).backward()
        opt.step()
        t2 = time.perf_counter_ns()
        predict_ns.append(t1 - t0)
        train_ns.append(t2 - t1)
    p, t = np.array(predict_ns[warm:]) / 1e6, np.array(train_ns[warm:]) / 1e6
    return {
        "predict_ms": float(np.median(p)),
        "train_ms": float(np.median(t)),
        "items_per_s": 1000 / float(np.mean(p + t)),
    }


def engine_run(settings: Any, xs: list[torch.Tensor], ys: list[int], interval_s: float, warm: int) -> dict[str, Any]:
    from services.trainer.engine_learner import EngineLearner
    from services.trainer.runner import build_zoo_model, load_profile, make_planner

    torch.manual_seed(0)
    zoo = build_zoo_model(settings)
    plan = make_planner(settings, load_profile(settings, zoo)).plan(settings.trainer.budget_bytes)
    learner = EngineLearner(zoo, plan, settings)
    clock = learner.clock
    _times.clear()
    t_start = time.perf_counter()
    t_origin = t_start  # event times run on from here (resetting them with t_start made the measured items
    base_event = time.time()  # stamped before the warm-up's, a backlog the admission rule partly skipped)
    skipped = 0
    try:
        for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
            if i == warm:
                _times.clear()
                t_start = time.perf_counter()
                skipped = 0
            due = t_start + (i - (warm if i >= warm else 0)) * interval_s if interval_s > 0 else 0.0
            clock.train_until(due)  # a 1 × 1 CPU plan trains on this thread (trainer.training_thread), as the loop does
            delay = due - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            event = base_event + (time.perf_counter() - t_origin) if interval_s > 0 else None
            began = time.perf_counter_ns()  # the record path's call: submit, then wait for the outcome
            outcome = learner.submit(i, x, y, None if event is None else round(event * 1000))()
            _times["learner.submit→outcome"].append(time.perf_counter_ns() - began)
            if interval_s <= 0:
                clock.drain(60)
            else:
                skipped += outcome.skipped is not None
        clock.drain(120)
        elapsed = time.perf_counter() - t_start
        stats = learner.engine.stats()
        service = learner.clock.service_times.service_time(0)
    finally:
        learner.close()
    n = len(xs) - warm
    seg = {
        k: {"calls": len(v), "median_us": float(np.median(v)) / 1e3, "total_ms_per_item": sum(v) / 1e6 / n}
        for k, v in sorted(_times.items())
    }
    fwd = [v for v in _times.get("_forward", [])]
    bwd = [v for v in _times.get("_backward", [])]
    return {
        "plan": f"{plan.num_stages}x{plan.num_workers}",
        "compensator": settings.trainer.compensator,
        "interval_ms": interval_s * 1000,
        "items": n,
        "skipped": skipped,
        "trained_items_per_s": (n - skipped) / elapsed,
        "service_ms_median_F_plus_B": (float(np.median(fwd)) + float(np.median(bwd))) / 1e6 if fwd and bwd else None,
        "service_time_estimate_ms": service * 1000,
        "segments": seg,
        "stats_skipped": dict(stats.skipped),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="mnistnet")
    parser.add_argument("--dataset", default="mnist")
    parser.add_argument("--profile", default=None, help="file in benchmarks/profiles (default MODEL.json)")
    parser.add_argument("--items", type=int, default=400)
    parser.add_argument("--warm", type=int, default=50)
    parser.add_argument("--interval-ms", type=float, default=30.0, help="paced run's interval (0: back to back)")
    parser.add_argument("--compensator", default=None)
    parser.add_argument("--out", default="service_time")
    parser.add_argument("--no-instrument", action="store_true")
    parser.add_argument("--data-root", default=None, help="datasets folder (default: ferret produce's)")
    args = parser.parse_args(argv)

    settings = settings_for(
        args.model, 1000 / max(args.interval_ms, 1.0), args.compensator, True, args.dataset, args.profile
    )
    torch.set_num_threads(settings.trainer.threads)
    torch.set_flush_denormal(True)
    xs, ys = items(args.items + args.warm, args.data_root, args.dataset)
    load_before = os.getloadavg()
    plain = plain_loop(settings, xs, ys, args.warm)
    if not args.no_instrument:
        instrument()
    paced = engine_run(settings, xs, ys, args.interval_ms / 1000, args.warm)
    back_to_back = engine_run(settings, xs, ys, 0.0, args.warm)
    plain_after = plain_loop(settings, xs, ys, args.warm)
    result = {
        "command": " ".join([".venv/bin/python", "-m", "benchmarks.engine.service_time", *(argv or sys.argv[1:])]),
        "commit": short_head(),
        "model": args.model,
        "dataset": args.dataset,
        "torch_threads": torch.get_num_threads(),
        "instrumented": not args.no_instrument,
        "plain": plain,
        "plain_after": plain_after,
        "paced": paced,
        "back_to_back": back_to_back,
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
    }
    print(write_result(RESULTS, args.out, result, render))
    return 0


def render(r: dict[str, Any]) -> str:
    plain = r["plain"]
    plain_ms = plain["train_ms"] + plain["predict_ms"]
    lines = [
        f"# Service time per item ({r['model']}, torch threads {r['torch_threads']}, commit {r['commit']})",
        "",
        f"Command: `{r['command']}`; load average before {r['load_average_before']}, after {r['load_average_after']}.",
        "",
        "| run | plan | service ms/item (F+B median) | ÷ plain train step | items/s trained | plain items/s "
        "| plain ÷ engine |",
        "|---|---|---|---|---|---|---|",
    ]
    for key in ("paced", "back_to_back"):
        e = r[key]
        service = e["service_ms_median_F_plus_B"]
        ratio = "—" if service is None else f"{service / plain['train_ms']:.2f}"
        lines.append(
            f"| {key} ({e['interval_ms']:.0f} ms) | {e['plan']} | {'—' if service is None else f'{service:.2f}'} "
            f"| {ratio} | {e['trained_items_per_s']:.0f} | {plain['items_per_s']:.0f} "
            f"| {plain['items_per_s'] / e['trained_items_per_s']:.2f} |"
        )
    lines += [
        "",
        f"Plain loop: predict {plain['predict_ms']:.2f} ms + train step {plain['train_ms']:.2f} ms (median) = "
        f"{plain_ms:.2f} ms; after the engine runs: {r['plain_after']['predict_ms']:.2f} + "
        f"{r['plain_after']['train_ms']:.2f} ms.",
        "",
        "Segments (paced run; nested: `execute` ⊃ `_forward`/`_backward` ⊃ the rest):",
        "",
        "| segment | calls | median µs | ms per item |",
        "|---|---|---|---|",
    ]
    for name, s in r["paced"]["segments"].items():
        lines.append(f"| {name} | {s['calls']} | {s['median_us']:.0f} | {s['total_ms_per_item']:.3f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
