"""What each compensator costs on process executors at saturation: ``none``, ``fisher`` (one-shot DC-ASGD),
``iter-fisher-lean`` (Alg. 1 in one step from the stash, no deltas), ``iter-fisher`` (Alg. 1 over the
stage's delta ring in shared memory, :mod:`ferret_core.engine.processes.deltas`) and ``dc-asgd-a``, on the
same plan, stream and initial weights (``--compensators`` picks arms).

The plan is N workers × 1 stage as processes (:class:`ferret_core.engine.processes.ProcessClock`), the
stream paced at ``--rate-factor`` × the plain loop's capacity (measured first in the same run), so every
arm is saturated; each arm predicts every arrival in the caller's process, as the trainer does. Per arm:

* *trained items/s* = items trained ÷ (first arrival → drained), and its ratio to ``none`` in the same
  repeat (the obvious alternative: no compensation);
* the compensator's *per-item cost*, measured inside the executors: wall seconds in ``compensate`` per
  trained item (under the stage's update lock) and, for Iter-Fisher, seconds writing θ_new − θ_old to
  the shared ring per update; the executors' CPU seconds per trained item;
* the same compensators' ``compensate`` alone, timed in this process on the model's real gradients
  (τ = 1 and 2, one torch thread): the call's own cost, without the other executor sharing the cores;
* how many calls had a stale gradient (τ > 0; ``none`` counts them too), truncated calls, the shared bytes.

Arms run interleaved in each repeat (none, lean, iter-fisher, then again), medians over repeats.

    flock /tmp/ferret-bench.lock .venv/bin/python -m benchmarks.distributed.compensators
    # → results/compensators.{md,json}
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.distributed.throughput import CASES, Warm, load_items, paced, plain_capacity, setup_for, units_of
from benchmarks.support import run_record, write_result
from ferret_core.compensation import CompensatorSettings, make_compensator
from ferret_core.engine.heap import retain_freed_memory
from ferret_core.engine.processes import ProcessClock, ProcessSettings
from services.config.data_root import default_data_root

RESULTS = Path(__file__).resolve().parent / "results"
COMPENSATORS = ("none", "fisher", "iter-fisher-lean", "iter-fisher", "dc-asgd-a")
GLIBC_HEAP = "glibc heap"  # the label of arms whose executors freed memory back to the system (--heap)


def _totals(clock: ProcessClock) -> dict[str, float]:
    """The executors' compensator counters and timers, summed over executors."""
    keys = ("calls", "compensated", "truncated", "compensate_seconds", "push_seconds")
    reports = clock.compensations()
    return {k: sum(r.stats[k] for r in reports) for k in keys}


def arm(
    units: list[nn.Module], model: str, xs: list[torch.Tensor], ys: list[int], lr: float, rate: float,
    workers: int, compensator: str, warm: Warm, retain_heap: bool = True,
) -> dict[str, Any]:
    setup = setup_for(model, len(units), workers, 1.0 / rate)
    settings = ProcessSettings(
        lr=lr, compensator=compensator, keep_trace=False, flush_denormal=True, retain_heap=retain_heap
    )
    with ProcessClock(units, setup, settings) as clock:
        for x, y in zip(*warm, strict=True):  # every executor's first actions (kernels, allocator), untimed
            clock.submit(x, y)
            clock.drain(60)
        base_usage, base = clock.usage(), _totals(clock)
        trained = 0

        def submit(batch_x: list[torch.Tensor], batch_y: list[int]) -> None:
            nonlocal trained
            trained += sum(a.skipped is None for a in clock.submit_many(batch_x, list(batch_y)))

        t0 = paced(submit, xs, ys, rate)
        clock.drain(300)
        elapsed = time.perf_counter() - t0
        usage, totals = clock.usage(), _totals(clock)
        updates = clock.updates()
        shared = clock.shared_bytes()
        rings = sum(d.nbytes() for d in clock.deltas if d is not None)
    delta = {k: totals[k] - base[k] for k in totals}
    return {
        "trained": trained,
        "elapsed_s": elapsed,
        "per_s": trained / elapsed,
        "executor_cpu_s": sum(u.cpu_seconds - b.cpu_seconds for u, b in zip(usage, base_usage, strict=True)),
        "updates": updates,
        **delta,
        "shared_mib": shared / 2**20,
        "ring_mib": rings / 2**20,
    }


def alone(
    units: list[nn.Module], xs: list[torch.Tensor], ys: list[int], lr: float, compensator: str, staleness: int,
    calls: int = 20,
) -> float:
    """Seconds per ``compensate`` call of ``compensator`` at ``staleness``, in this process: the gradient of
    one real item, the deltas ``staleness`` SGD steps on the next ones (ring capacity 2, as a 2 × 1 plan)."""
    model = nn.Sequential(*units)
    params = list(model.parameters())

    def grad(k: int) -> list[torch.Tensor]:
        loss = F.cross_entropy(model(xs[k].unsqueeze(0)), torch.tensor([ys[k]]))
        return [g.detach() for g in torch.autograd.grad(loss, params)]

    theta_then = [p.detach().clone() for p in params]
    deltas = [[-lr * g for g in grad(1 + k)] for k in range(staleness)]
    theta_now = [t + sum(d[i] for d in deltas) for i, t in enumerate(theta_then)]
    comp = make_compensator(compensator, theta_then, CompensatorSettings(), 2)
    for delta in deltas:
        comp.observe_update(delta)
    g = grad(0)
    for _ in range(3):  # warm-up
        comp.compensate(g, staleness=staleness, theta_then=theta_then, theta_now=theta_now)
    t0 = time.perf_counter()
    for _ in range(calls):
        comp.compensate(g, staleness=staleness, theta_then=theta_then, theta_now=theta_now)
    return (time.perf_counter() - t0) / calls


def measure(
    model: str, items: int, warm: int, repeats: int, factor: float, workers: int, root: Path,
    compensators: tuple[str, ...] = COMPENSATORS, heaps: tuple[bool, ...] = (True,),
) -> dict[str, Any]:
    """``heaps``: whether the executors keep freed memory, per arm (both: every compensator twice, interleaved;
    the arm with glibc's defaults is labelled ``<name>, glibc heap``)."""
    dataset, kwargs, lr = CASES[model]
    xs, ys = load_items(dataset, items + warm, root)
    units = units_of(model, kwargs)
    plain_capacity(units, xs[:warm], ys[:warm], lr, 1)  # warm-up: kernels, allocator
    warm_items = (xs[: 2 * workers], ys[: 2 * workers])
    xs, ys = xs[warm:], ys[warm:]
    arms = [(name, retain) for name in compensators for retain in heaps]
    rows: dict[str, list[dict[str, Any]]] = {label(name, retain): [] for name, retain in arms}
    capacities = []
    for _ in range(repeats):
        cap = plain_capacity(units, xs, ys, lr, 1)
        capacities.append(cap["trained"] / cap["elapsed_s"])
        rate = factor * capacities[-1]
        for name, retain in arms:
            row = arm(units, model, xs, ys, lr, rate, workers, name, warm_items, retain)
            rows[label(name, retain)].append({**row, "stream_rate": rate})
        print(json.dumps({n: round(r[-1]["per_s"], 1) for n, r in rows.items()}), flush=True)
    costs = {
        name: {tau: [alone(units, xs, ys, lr, name, tau) for _ in range(repeats)] for tau in (1, 2)}
        for name in compensators
    }
    return {"model": model, "dataset": dataset, "items": items, "lr": lr, "workers": workers,
            "plain_capacity_per_s": capacities, "arms": rows, "alone_s": costs}


def label(name: str, retain_heap: bool) -> str:
    """An arm's row name: the compensator, marked where the executors ran with glibc's heap defaults."""
    return name if retain_heap else f"{name}, {GLIBC_HEAP}"


def _median(values: list[float]) -> float:
    return float(statistics.median(values))


def table(res: dict[str, Any]) -> str:
    lines = [
        "| compensator | trained items/s | ÷ none (same repeat) | trained share | stale share of calls | "
        "truncated | compensate ms / trained item | ring push ms / update | executor CPU ms / trained item | "
        "shared MiB (ring) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    arms = res["arms"]
    for name, rows in arms.items():
        none = arms[label("none", not name.endswith(GLIBC_HEAP))]  # the same heap's none
        ratio = _median([r["per_s"] / n["per_s"] for r, n in zip(rows, none, strict=True)])
        lines.append(
            f"| {name} | {_median([r['per_s'] for r in rows]):.1f} | {ratio:.2f}× | "
            f"{100 * _median([r['trained'] / res['items'] for r in rows]):.0f} % | "
            f"{100 * _median([r['compensated'] / max(1.0, r['calls']) for r in rows]):.0f} % | "
            f"{_median([r['truncated'] for r in rows]):.0f} | "
            f"{1e3 * _median([r['compensate_seconds'] / max(1, r['trained']) for r in rows]):.3f} | "
            f"{1e3 * _median([r['push_seconds'] / max(1, r['updates']) for r in rows]):.3f} | "
            f"{1e3 * _median([r['executor_cpu_s'] / max(1, r['trained']) for r in rows]):.2f} | "
            f"{rows[-1]['shared_mib']:.1f} ({rows[-1]['ring_mib']:.1f}) |"
        )
    pairs = [n for n in arms if label(n, False) in arms and not n.endswith(GLIBC_HEAP)]
    if pairs:
        lines += [
            "",
            "Executors keeping freed memory ÷ the same compensator with glibc's heap defaults (medians of the "
            "per-repeat ratios):",
            "",
            "| compensator | trained items/s | compensate ms / trained item | executor CPU ms / trained item |",
            "|---|---:|---:|---:|",
        ]
        for name in pairs:
            kept, freed = arms[name], arms[label(name, False)]

            def ratio(key: str, rows: tuple[list[dict[str, Any]], list[dict[str, Any]]] = (kept, freed)) -> float:
                per = [
                    (a[key] / max(1, a["trained"])) / max(1e-12, b[key] / max(1, b["trained"]))
                    for a, b in zip(*rows, strict=True)
                ]
                return _median(per)

            items = _median([a["per_s"] / b["per_s"] for a, b in zip(kept, freed, strict=True)])
            comp = "–" if name == "none" else f"{ratio('compensate_seconds'):.2f}×"
            lines.append(f"| {name} | {items:.2f}× | {comp} | {ratio('executor_cpu_s'):.2f}× |")
    lines += [
        "",
        "`compensate` alone, in the benchmark's process (one torch thread, the model's real gradients), ms per call:",
        "",
        "| compensator | τ = 1 | τ = 2 |",
        "|---|---:|---:|",
    ]
    for name, by_tau in res["alone_s"].items():
        one, two = (by_tau[t] if t in by_tau else by_tau[str(t)] for t in (1, 2))  # str keys once read from JSON
        lines.append(f"| {name} | {1e3 * _median(one):.2f} | {1e3 * _median(two):.2f} |")
    return "\n".join(lines)


def render(result: dict[str, Any], args: argparse.Namespace) -> str:
    res = result["result"]
    return (
        f"# Compensators on process executors: {res['model']} / {res['dataset']}, {res['workers']} workers × 1 "
        f"stage, {args.rate_factor:g}× the plain loop's capacity\n\n"
        f"Command: `{result['command']}` at {result['commit']}; {result['cpus']} CPUs, load before "
        f"{result['load_before'][0]:.2f}; medians of {args.repeats} repeats of {res['items']} items (plain "
        f"loop capacity {_median(res['plain_capacity_per_s']):.0f} items/s). Other engineers' tests may have "
        f"shared the CPU.\n\n{table(res)}\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="mnistnet", choices=list(CASES))
    parser.add_argument("--items", type=int, default=600)
    parser.add_argument("--warm", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rate-factor", type=float, default=2.0, help="stream rate ÷ the plain loop's capacity")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--data-root", type=Path, default=None)
    parser.add_argument(
        "--compensators", nargs="+", default=list(COMPENSATORS), choices=COMPENSATORS,
        help="arms; none is required (the others' ratios are to it)",
    )
    parser.add_argument(
        "--heap", choices=("retained", "default", "both"), default="retained",
        help="the executors and this process (the 'alone' timings) keep freed memory in their heap "
        "(ferret_core.engine.heap, as the executors ship), or glibc's defaults; both: each compensator's arm "
        "twice, interleaved, the executors retaining and not (this process with glibc's defaults)",
    )
    parser.add_argument("--out", default="compensators")
    args = parser.parse_args(argv)
    if "none" not in args.compensators:
        parser.error("--compensators must include none (every arm's ratio is to it)")
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    if args.heap == "retained":
        retain_freed_memory()
    load = os.getloadavg()
    res = measure(
        args.model, args.items, args.warm, args.repeats, args.rate_factor, args.workers,
        args.data_root or default_data_root(), tuple(args.compensators),
        {"retained": (True,), "default": (False,), "both": (True, False)}[args.heap],
    )
    print(table(res), flush=True)
    result = run_record("benchmarks.distributed.compensators", argv, load, result=res)
    write_result(RESULTS, args.out, result, lambda r: render(r, args))
    print(json.dumps({"written": str(RESULTS / args.out)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
