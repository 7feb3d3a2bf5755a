"""What each compensator costs on process executors at saturation: ``none``, ``iter-fisher-lean`` (Alg. 1
in one step from the stash, no deltas) and ``iter-fisher`` (Alg. 1 over the stage's delta ring in shared
memory, :mod:`ferret_core.engine.processes.deltas`), on the same plan, stream and initial weights.

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
from ferret_core.engine.processes import ProcessClock, ProcessSettings
from services.config.data_root import default_data_root

RESULTS = Path(__file__).resolve().parent / "results"
COMPENSATORS = ("none", "iter-fisher-lean", "iter-fisher")


def _totals(clock: ProcessClock) -> dict[str, float]:
    """The executors' compensator counters and timers, summed over executors."""
    keys = ("calls", "compensated", "truncated", "compensate_seconds", "push_seconds")
    reports = clock.compensations()
    return {k: sum(r.stats[k] for r in reports) for k in keys}


def arm(
    units: list[nn.Module], model: str, xs: list[torch.Tensor], ys: list[int], lr: float, rate: float,
    workers: int, compensator: str, warm: Warm,
) -> dict[str, Any]:
    setup = setup_for(model, len(units), workers, 1.0 / rate)
    settings = ProcessSettings(lr=lr, compensator=compensator, keep_trace=False, flush_denormal=True)
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


def measure(model: str, items: int, warm: int, repeats: int, factor: float, workers: int, root: Path) -> dict[str, Any]:
    dataset, kwargs, lr = CASES[model]
    xs, ys = load_items(dataset, items + warm, root)
    units = units_of(model, kwargs)
    plain_capacity(units, xs[:warm], ys[:warm], lr, 1)  # warm-up: kernels, allocator
    warm_items = (xs[: 2 * workers], ys[: 2 * workers])
    xs, ys = xs[warm:], ys[warm:]
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in COMPENSATORS}
    capacities = []
    for _ in range(repeats):
        cap = plain_capacity(units, xs, ys, lr, 1)
        capacities.append(cap["trained"] / cap["elapsed_s"])
        rate = factor * capacities[-1]
        for name in COMPENSATORS:
            rows[name].append({**arm(units, model, xs, ys, lr, rate, workers, name, warm_items), "stream_rate": rate})
        print(json.dumps({n: round(r[-1]["per_s"], 1) for n, r in rows.items()}), flush=True)
    costs = {
        name: {tau: [alone(units, xs, ys, lr, name, tau) for _ in range(repeats)] for tau in (1, 2)}
        for name in COMPENSATORS
    }
    return {"model": model, "dataset": dataset, "items": items, "lr": lr, "workers": workers,
            "plain_capacity_per_s": capacities, "arms": rows, "alone_s": costs}


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
        ratio = _median([r["per_s"] / n["per_s"] for r, n in zip(rows, arms["none"], strict=True)])
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
    lines += [
        "",
        "`compensate` alone, in the benchmark's process (one torch thread, the model's real gradients), ms per call:",
        "",
        "| compensator | τ = 1 | τ = 2 |",
        "|---|---:|---:|",
    ]
    for name, by_tau in res["alone_s"].items():
        lines.append(f"| {name} | {1e3 * _median(by_tau[1]):.2f} | {1e3 * _median(by_tau[2]):.2f} |")
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
    parser.add_argument("--out", default="compensators")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    load = os.getloadavg()
    res = measure(
        args.model, args.items, args.warm, args.repeats, args.rate_factor, args.workers,
        args.data_root or default_data_root(),
    )
    print(table(res), flush=True)
    result = run_record("benchmarks.distributed.compensators", argv, load, result=res)
    write_result(RESULTS, args.out, result, lambda r: render(r, args))
    print(json.dumps({"written": str(RESULTS / args.out)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
