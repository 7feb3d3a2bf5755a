"""Trained items per second at saturation: process executors against the plain loop, the inline engine
and the thread executors, in one run on this machine.

Every arm sees the same items of a real dataset, the same initial weights and learning rate, and (for
the stream arms) the same paced stream at ``--rate-factor`` × the plain loop's capacity, so every arm is
saturated and must predict every arrival as well as train:

* **plain capacity, 1 / 2 torch threads**: predict + one SGD step per item, back to back (no stream): the
  most a sequential loop can train, and the other obvious use of two cores (intra-op threads);
* **plain loop** on the stream: predict every arrival (the backlog in one batched forward), train on the
  newest, skip the rest while behind (what a user would write; one thread);
* **engine inline 1 × 1**: Ferret's wall clock training on the caller's thread (what the trainer runs today);
* **thread executors 1 × N**: the wall clock's executor threads, N workers, one process;
* **process executors 1 × N**: :class:`ferret_core.engine.processes.ProcessClock`, N worker processes over
  the master in shared memory; its start-up, each process's CPU and the coordinator's CPU are reported;
* **process executors 2 stages × 1**: one worker's two stages (cut where their forward + backward times
  balance, timed here) in two processes, passing activations and gradients over gloo.

*Trained items/s* = items trained ÷ (first arrival → drained). Ratios are to the plain loop on the same
stream, and to the plain loop's capacity. One torch thread per executor (and per plain loop, except the
2-thread arm); compensator ``none``; no T1–T4.

    .venv/bin/python -m benchmarks.distributed.throughput                       # → results/throughput.{md,json}
    .venv/bin/python -m benchmarks.distributed.throughput --models mnistnet --items 600 --repeats 1
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.engine.service_time import items
from benchmarks.support import run_record, write_result
from ferret_core.engine import EngineSettings, StreamEngine
from ferret_core.engine.heap import retain_freed_memory
from ferret_core.engine.policies import PolicySetup, sequential_plan
from ferret_core.engine.processes import ProcessClock, ProcessSettings
from ferret_core.engine.processes.hosts import Hosts
from ferret_core.plan import Partition, Plan, WorkerConfig
from ferret_core.schedule.scheduler import PlanRules
from ferret_core.zoo import build_model

RESULTS = Path(__file__).resolve().parent / "results"
CPU = torch.device("cpu")

# model, dataset, build_model keywords, learning rate
CASES: dict[str, tuple[str, dict[str, Any], float]] = {
    "mlp": ("digits", {"in_features": 64}, 0.05),
    "mnistnet": ("mnist", {}, 0.02),
    "convnet": ("cifar10", {}, 0.02),
    "resnet18": ("cifar10", {}, 0.02),
}


def load_items(dataset: str, n: int, root: Path) -> tuple[list[torch.Tensor], list[int]]:
    return items(n, str(root), dataset)


def units_of(model: str, kwargs: dict[str, Any]) -> list[nn.Module]:
    return list(build_model(model, seed=0, **kwargs).units)


def setup_for(
    model: str, num_units: int, workers: int, interval: float, boundaries: tuple[int, ...] | None = None
) -> PolicySetup:
    """A plan of ``workers`` workers over one stage, or over the stages ``boundaries`` cut (no T1–T4)."""
    plan = sequential_plan(model, num_units, interval)
    partition = Partition(boundaries or (0, num_units))
    p = partition.num_stages
    plan = dataclasses.replace(
        plan,
        partition=partition,
        workers=tuple(
            WorkerConfig(n, live=True, recompute=False, accumulation=(1,) * p, omission=(0,) * p)
            for n in range(workers)
        ),
    )
    return setup_of(plan)


def setup_of(plan: Plan) -> PolicySetup:
    """Ferret's rules over a hand-made plan (no planner: nothing is budgeted)."""
    return PolicySetup("ferret", plan, PlanRules(plan), instant=False, planned=None)


def balanced_cut(units: list[nn.Module], x: torch.Tensor, repeats: int = 5) -> tuple[int, int, int]:
    """Two stages of about equal forward + backward time on this machine (each unit timed on its input)."""
    model = nn.Sequential(*copy.deepcopy(units))
    inputs, h = [], x.unsqueeze(0)
    with torch.no_grad():
        for unit in model:
            inputs.append(h)
            h = unit(h)
    times = [0.0] * len(units)
    for _ in range(repeats):
        for u, unit in enumerate(model):
            t0 = time.perf_counter()
            h_in = inputs[u].detach().requires_grad_(True)
            out = unit(h_in)
            torch.autograd.grad(out, [h_in, *unit.parameters()], torch.ones_like(out), allow_unused=True)
            times[u] += time.perf_counter() - t0
    total = sum(times)
    cut = min(range(1, len(units)), key=lambda k: abs(sum(times[:k]) - total / 2))
    return (0, cut, len(units))


Warm = tuple[list[torch.Tensor], list[int]]

# ---------------------------------------------------------------------------------------------- arms
def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def plain_capacity(
    units: list[nn.Module], xs: list[torch.Tensor], ys: list[int], lr: float, threads: int, device: torch.device = CPU
) -> dict[str, Any]:
    """Each item arrives on the host, is predicted (the class read back, as a publisher would) and trained."""
    torch.set_num_threads(threads)
    model = nn.Sequential(*copy.deepcopy(units)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    synchronize(device)
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    for x, y in zip(xs, ys, strict=True):
        x_d = x.unsqueeze(0).to(device)
        with torch.no_grad():
            model(x_d).argmax(1).tolist()
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x_d), torch.tensor([y], device=device)).backward()
        opt.step()
    synchronize(device)
    elapsed = time.perf_counter() - t0
    torch.set_num_threads(1)
    return {"trained": len(xs), "elapsed_s": elapsed, "cpu_s": time.process_time() - cpu0}


def plain_stream(
    units: list[nn.Module], xs: list[torch.Tensor], ys: list[int], lr: float, rate: float, device: torch.device = CPU
) -> dict[str, Any]:
    """Predict every arrival (the backlog batched), train on the newest, skip the rest while behind."""
    model = nn.Sequential(*copy.deepcopy(units)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    n = len(xs)
    trained = 0
    nxt = 0
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    while nxt < n:
        arrived = min(n, int((time.perf_counter() - t0) * rate) + 1)
        if arrived <= nxt:
            time.sleep(max(0.0, t0 + nxt / rate - time.perf_counter()))
            continue
        with torch.no_grad():
            model(torch.stack(xs[nxt:arrived]).to(device)).argmax(1).tolist()
        newest = arrived - 1
        opt.zero_grad(set_to_none=True)
        x_d = xs[newest].unsqueeze(0).to(device)
        F.cross_entropy(model(x_d), torch.tensor([ys[newest]], device=device)).backward()
        opt.step()
        trained += 1
        nxt = arrived
    synchronize(device)
    return {"trained": trained, "elapsed_s": time.perf_counter() - t0, "cpu_s": time.process_time() - cpu0}


Batch = Callable[[list[torch.Tensor], list[int]], None]


def paced(submit: Batch, xs: list[torch.Tensor], ys: list[int], rate: float, window: float = 0.0,
          idle: Callable[[float], None] | None = None) -> float:
    """Deliver the stream at ``rate``: at each wake-up every item whose arrival time has passed, as one
    batch (a consumer's poll); wake-ups at each arrival, or at most every ``window`` seconds. ``idle``
    (an inline trainer) trains until the next wake-up instead of sleeping."""
    t0 = time.perf_counter()
    last_wake = t0
    n, nxt = len(xs), 0
    while nxt < n:
        due = min(n, int((time.perf_counter() - t0) * rate) + 1)
        if due > nxt:
            submit(xs[nxt:due], ys[nxt:due])
            nxt = due
            continue
        wake = max(t0 + nxt / rate, last_wake + window)
        if idle is not None:
            idle(wake)
        delay = wake - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        last_wake = wake
    return t0


def engine_wall(units: list[nn.Module], model: str, xs: list[torch.Tensor], ys: list[int], lr: float, rate: float,
                workers: int, inline: bool, warm: Warm, window: float, boundaries: tuple[int, ...] | None = None,
                device: torch.device = CPU) -> dict[str, Any]:
    setup = setup_for(model, len(units), workers, 1.0 / rate, boundaries)
    devices = None if device.type == "cpu" else [device] * setup.plan.num_stages
    engine = StreamEngine(units, setup, EngineSettings(lr=lr, measure_memory=False, keep_trace=False), devices=devices)
    clock = engine.wall_clock(inline_training=inline, inline_predictions=True)
    futures = []
    with clock:
        for x, y in zip(*warm, strict=True):  # every executor's first actions (kernels, allocator), untimed
            clock.submit(x, y)
            clock.predict_queued()
            clock.drain(60)
        cpu0 = time.process_time()

        def submit(batch_x: list[torch.Tensor], batch_y: list[int]) -> None:
            futures.extend(clock.submit(x, y) for x, y in zip(batch_x, batch_y, strict=True))
            clock.predict_queued()  # the batch in one forward pass

        t0 = paced(submit, xs, ys, rate, window, clock.train_until if inline else None)
        clock.drain(300)
        elapsed = time.perf_counter() - t0
    trained = sum(f.result().skipped is None for f in futures)
    return {"trained": trained, "elapsed_s": elapsed, "cpu_s": time.process_time() - cpu0}


def processes(units: list[nn.Module], model: str, xs: list[torch.Tensor], ys: list[int], lr: float, rate: float,
              workers: int, warm: Warm, window: float, boundaries: tuple[int, ...] | None = None,
              hosts: Hosts | None = None, retain_heap: bool = True) -> dict[str, Any]:
    """Process executors on the stream; with ``hosts`` (placed by the caller), over several hosts, with
    the predictions' freshness. ``retain_heap``: the executors keep freed memory (``ProcessSettings``)."""
    setup = setup_for(model, len(units), workers, 1.0 / rate, boundaries)
    settings = ProcessSettings(lr=lr, keep_trace=False, flush_denormal=True, retain_heap=retain_heap)
    clock = ProcessClock(units, setup, settings, hosts=hosts)
    with clock:
        start_s = clock.start_seconds
        for x, y in zip(*warm, strict=True):  # every executor's first actions (kernels, allocator), untimed
            clock.submit(x, y)
            clock.drain(60)
        base = clock.usage()
        trained = 0
        cpu0 = time.process_time()

        def submit(batch_x: list[torch.Tensor], batch_y: list[int]) -> None:
            nonlocal trained
            trained += sum(a.skipped is None for a in clock.submit_many(batch_x, list(batch_y)))

        t0 = paced(submit, xs, ys, rate, window)
        clock.drain(300)
        elapsed = time.perf_counter() - t0
        usage = clock.usage()
        shared = clock.shared_bytes()
    fresh = {} if hosts is None else {"freshness": dataclasses.asdict(hosts.freshness())}
    return {
        **fresh,
        "trained": trained,
        "elapsed_s": elapsed,
        "cpu_s": time.process_time() - cpu0,
        "start_s": start_s,
        "executor_cpu_s": [u.cpu_seconds - b.cpu_seconds for u, b in zip(usage, base, strict=True)],
        "executor_rss_mib": [u.max_rss_bytes / 2**20 for u in usage],
        "shared_mib": shared / 2**20,
    }


# --------------------------------------------------------------------------------------------- driver
@dataclasses.dataclass(frozen=True)
class Case:
    """One model's arms' common ground: its units, the measured items, lr, each executor's untimed first
    items and the balanced 2-stage cut."""

    dataset: str
    units: list[nn.Module]
    xs: list[torch.Tensor]
    ys: list[int]
    lr: float
    warm_items: Warm
    cut: tuple[int, int, int]


def prepare(model: str, items: int, warm: int, workers: int, root: Path) -> Case:
    """Load ``model``'s items, warm torch up on the first ``warm`` of them and time the 2-stage cut."""
    dataset, kwargs, lr = CASES[model]
    xs, ys = load_items(dataset, items + warm, root)
    units = units_of(model, kwargs)
    plain_capacity(units, xs[:warm], ys[:warm], lr, 1)  # warm-up: kernels, allocator
    warm_items = (xs[: 2 * workers], ys[: 2 * workers])
    return Case(dataset, units, xs[warm:], ys[warm:], lr, warm_items, balanced_cut(units, xs[0]))


def measure(
    model: str, items: int, warm: int, repeats: int, factor: float, workers: int, root: Path, window: float,
    retain_heap: bool = True,
) -> dict[str, Any]:
    case = prepare(model, items, warm, workers, root)
    dataset, units, xs, ys, lr, warm_items, cut = (
        case.dataset, case.units, case.xs, case.ys, case.lr, case.warm_items, case.cut
    )
    rows: dict[str, list[dict[str, Any]]] = {}
    for _ in range(repeats):
        cap1 = plain_capacity(units, xs, ys, lr, 1)
        rate = factor * cap1["trained"] / cap1["elapsed_s"]
        arms = {
            "plain capacity, 1 thread": cap1,
            "plain capacity, 2 threads": plain_capacity(units, xs, ys, lr, 2),
            "plain loop": plain_stream(units, xs, ys, lr, rate),
            "engine inline 1 × 1": engine_wall(units, model, xs, ys, lr, rate, 1, True, warm_items, window),
            f"thread executors 1 × {workers}": engine_wall(
                units, model, xs, ys, lr, rate, workers, False, warm_items, window
            ),
            "process executors 1 × 1": processes(
                units, model, xs, ys, lr, rate, 1, warm_items, window, retain_heap=retain_heap
            ),
            f"process executors 1 × {workers}": processes(
                units, model, xs, ys, lr, rate, workers, warm_items, window, retain_heap=retain_heap
            ),
            "process executors 2 stages × 1": processes(
                units, model, xs, ys, lr, rate, 1, warm_items, window, cut, retain_heap=retain_heap
            ),
        }
        for name, row in arms.items():
            rows.setdefault(name, []).append({**row, "stream_rate": rate, "per_s": row["trained"] / row["elapsed_s"]})
    return {"model": model, "dataset": dataset, "items": items, "lr": lr, "arms": rows}


def median_of(rows: Sequence[dict[str, Any]], key: str) -> float:
    """The median of ``key`` over the repeats' rows of one arm."""
    return float(statistics.median(float(r[key]) for r in rows))


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| model / data | arm | trained items/s (median) | ÷ plain loop (same stream) | ÷ plain capacity | "
        "trained share | CPU s (caller / executors) | start-up s |",
        "|---|---|---:|---:|---:|---:|---|---:|",
    ]
    for res in results:
        arms = res["arms"]
        plain = median_of(arms["plain loop"], "per_s")
        capacity = median_of(arms["plain capacity, 1 thread"], "per_s")
        for name, rows in arms.items():
            per_s = median_of(rows, "per_s")
            share = statistics.median(r["trained"] / res["items"] for r in rows)
            executors = rows[-1].get("executor_cpu_s")
            cpu = f"{median_of(rows, 'cpu_s'):.1f}"
            if executors is not None:
                cpu += " / " + ", ".join(f"{c:.1f}" for c in executors)
            start = f"{median_of(rows, 'start_s'):.3f}" if "start_s" in rows[-1] else ""
            lines.append(
                f"| {res['model']} / {res['dataset']} | {name} | {per_s:.1f} | {per_s / plain:.2f}× | "
                f"{per_s / capacity:.2f}× | {100 * share:.0f} % | {cpu} | {start} |"
            )
    return "\n".join(lines)


def render(result: dict[str, Any], factor: float, repeats: int) -> str:
    return (
        f"# Trained items/s at saturation ({factor:g}× the plain loop's capacity)\n\n"
        f"Command: `{result['command']}` at {result['commit']}; {result['cpus']} CPUs, load before "
        f"{result['load_before'][0]:.2f}; medians of {repeats} repeats.\n\n{table(result['results'])}\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["mlp", "mnistnet", "convnet", "resnet18"], choices=list(CASES))
    parser.add_argument("--items", type=int, default=600, help="items per arm (resnet18 uses a quarter)")
    parser.add_argument("--warm", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rate-factor", type=float, default=2.0, help="stream rate ÷ the plain loop's capacity")
    parser.add_argument("--workers", type=int, default=2, help="N of the multi-worker arms")
    parser.add_argument(
        "--window-ms", type=float, default=0.0,
        help="stream arms take arrivals at most this often, as one batch (a consumer's poll); 0: at each arrival",
    )
    parser.add_argument(
        "--heap", choices=("all", "executors", "none"), default="all",
        help="who keeps freed memory in its heap (ferret_core.engine.heap): every process (as the trainer ships: "
        "this process plays its record path, and the plain loop gets the same setting), the executor processes "
        "only, or none (glibc's defaults)",
    )
    parser.add_argument("--data-root", type=Path, default=None)
    parser.add_argument("--out", default="throughput")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    if args.heap == "all":
        retain_freed_memory()
    if args.data_root is None:  # the service's default (its config package imports Kafka and protobuf)
        from services.config.data_root import default_data_root

        args.data_root = default_data_root()
    root = args.data_root
    load = os.getloadavg()
    results = []
    for model in args.models:
        items = max(50, args.items // 4) if model == "resnet18" else args.items
        results.append(
            measure(
                model, items, args.warm, args.repeats, args.rate_factor, args.workers, root, args.window_ms / 1000,
                retain_heap=args.heap != "none",
            )
        )
        print(table(results[-1:]), flush=True)
    peak_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result = run_record("benchmarks.distributed.throughput", argv, load, peak_rss_mib=peak_rss_mib, results=results)
    write_result(RESULTS, args.out, result, lambda r: render(r, args.rate_factor, args.repeats))
    print(json.dumps({"written": str(RESULTS / args.out)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
