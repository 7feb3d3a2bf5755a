"""Trained items/s at saturation on a CUDA machine: the throughput table of ``throughput.py``, on the GPU.

The same protocol as ``throughput.py`` (same items, initial weights, learning rate; a paced stream at
``--rate-factor`` × the plain loop's capacity, *here the CUDA plain loop's*; trained items/s = items trained ÷
(first arrival → drained)), with the arms a GPU machine offers:

* **plain capacity, cuda**: predict (class read back to the host, as a publisher would) + one SGD step per
  item, back to back, the model on the GPU: the most a sequential loop trains there;
* **plain loop, cuda**: the stream loop of ``throughput.py`` on the GPU (predict every arrival batched, train
  the newest, skip the rest while behind);
* **thread executors 1 × N, cuda**: the wall clock's executor threads, N workers over one master on the GPU,
  each action on a CUDA stream of its own and ended by an event (several workers on one GPU through CUDA
  streams; MPS, several processes on one GPU, is not tried: the process executors run no CUDA stage);
* **thread executors 2 stages × 1, cuda**: one worker's two stages on the same GPU, on separate streams;
* **plain capacity, cpu** and **process executors 1 × N, cpu**: the host's cores with the process executors
  (:class:`~ferret_core.engine.processes.ProcessClock` is CPU-only: its master lives in host shared memory),
  against the same stream, for the many-core host beside the GPU.

Each arm that fails is recorded with its error instead of ending the run (a first run on an accelerator).
Results are written after every model, so a run cut short keeps what it measured.

    python3 -m benchmarks.distributed.gpu --data-root DIR --results-dir DIR       # → gpu.{md,json}
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch

from benchmarks.distributed.throughput import (
    CASES,
    CPU,
    RESULTS,
    balanced_cut,
    engine_wall,
    load_items,
    plain_capacity,
    plain_stream,
    processes,
    units_of,
)
from benchmarks.support import write_result


def attempt(arm: Callable[[], dict[str, Any]], device: torch.device) -> dict[str, Any]:
    """The arm's row, with the GPU allocator's peak over it; an exception becomes the row's ``error``."""
    gc.collect()  # an earlier arm's engine (threads, cycles) frees its CUDA tensors only when collected
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    try:
        row = arm()
    except Exception as exc:  # a first run on a GPU: record, go on
        return {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc(limit=8)}
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        row["cuda_peak_mib"] = (torch.cuda.max_memory_allocated(device) - base) / 2**20
    row["per_s"] = row["trained"] / row["elapsed_s"]
    return row


def measure(model: str, items: int, warm: int, repeats: int, factor: float, workers: list[int],
            cpu_workers: list[int], root: Path, device: torch.device) -> dict[str, Any]:
    dataset, kwargs, lr = CASES[model]
    xs, ys = load_items(dataset, items + warm, root)
    units = units_of(model, kwargs)
    plain_capacity(units, xs[:warm], ys[:warm], lr, 1, device)  # warm-up: kernels, allocator, cuDNN choice
    cut = balanced_cut(units, xs[0])
    xs, ys = xs[warm:], ys[warm:]
    rows: dict[str, list[dict[str, Any]]] = {}
    tag = device.type
    for _ in range(repeats):
        cap = attempt(partial(plain_capacity, units, xs, ys, lr, 1, device), device)
        rate = factor * cap["per_s"]
        warm_n = (xs[: 2 * max(workers + cpu_workers)], ys[: 2 * max(workers + cpu_workers)])
        arms: dict[str, tuple[Callable[[], dict[str, Any]], torch.device]] = {
            f"plain loop, {tag}": (partial(plain_stream, units, xs, ys, lr, rate, device), device),
        }
        wall = partial(
            engine_wall, units, model, xs, ys, lr, rate, inline=False, warm=warm_n, window=0.0, device=device
        )
        for n in workers:
            arms[f"thread executors 1 × {n}, {tag}"] = (partial(wall, workers=n), device)
        arms[f"thread executors 2 stages × 1, {tag}"] = (partial(wall, workers=1, boundaries=cut), device)
        arms["plain capacity, cpu 1 thread"] = (partial(plain_capacity, units, xs, ys, lr, 1, CPU), CPU)
        for n in cpu_workers:
            arms[f"process executors 1 × {n}, cpu"] = (
                partial(processes, units, model, xs, ys, lr, rate, n, warm_n, 0.0), CPU
            )
        rows.setdefault(f"plain capacity, {tag}", []).append({**cap, "stream_rate": rate})
        for name, (arm, on) in arms.items():
            rows.setdefault(name, []).append({**attempt(arm, on), "stream_rate": rate})
            print(f"{model} {name}: {rows[name][-1].get('per_s', rows[name][-1].get('error'))}", flush=True)
    return {"model": model, "dataset": dataset, "items": items, "lr": lr, "cut": cut, "device": tag, "arms": rows}


def _median(arms: dict[str, list[dict[str, Any]]], name: str, key: str) -> float | None:
    values = [float(r[key]) for r in arms.get(name, []) if key in r]
    return statistics.median(values) if values else None


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| model / data | arm | trained items/s (median) | ÷ plain loop, cuda (same stream) | ÷ plain capacity, cuda | "
        "trained share | GPU peak MiB | CPU s (caller / executors) |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for res in results:
        arms: dict[str, list[dict[str, Any]]] = res["arms"]
        median = partial(_median, arms)
        plain = median(f"plain loop, {res.get('device', 'cuda')}", "per_s")
        capacity = median(f"plain capacity, {res.get('device', 'cuda')}", "per_s")
        for name, rows in arms.items():
            errors = [r["error"] for r in rows if "error" in r]
            per_s = median(name, "per_s")
            if per_s is None:
                lines.append(f"| {res['model']} / {res['dataset']} | {name} | error: {errors[0][:120]} | | | | | |")
                continue
            share = statistics.median(r["trained"] / res["items"] for r in rows if "trained" in r)
            peak = median(name, "cuda_peak_mib")
            cpu = f"{median(name, 'cpu_s'):.1f}"
            executors = next((r["executor_cpu_s"] for r in reversed(rows) if "executor_cpu_s" in r), None)
            if executors is not None:
                cpu += " / " + ", ".join(f"{c:.1f}" for c in executors)
            ratio_plain = f"{per_s / plain:.2f}×" if plain else ""
            ratio_cap = f"{per_s / capacity:.2f}×" if capacity else ""
            note = f" ({len(errors)} of {len(rows)} failed)" if errors else ""
            lines.append(
                f"| {res['model']} / {res['dataset']} | {name}{note} | {per_s:.1f} | {ratio_plain} | {ratio_cap} | "
                f"{100 * share:.0f} % | {'' if peak is None else f'{peak:.1f}'} | {cpu} |"
            )
    return "\n".join(lines)


def render(result: dict[str, Any]) -> str:
    env = result["environment"]
    return (
        f"# Trained items/s at saturation on {env['device_name']} ({result['rate_factor']:g}× the CUDA plain "
        f"loop's capacity)\n\n"
        f"Command: `{result['command']}` at {result['commit']}; torch {env['torch']} (CUDA {env['cuda']}), "
        f"{env['cpus']} CPUs, Python {env['python']}; medians of {result['repeats']} repeats; "
        f"{result['seconds']:.0f} s in all.\n\n{table(result['results'])}\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["mnistnet", "convnet", "resnet18", "mlp"], choices=list(CASES))
    parser.add_argument("--items", type=int, default=600)
    parser.add_argument("--warm", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rate-factor", type=float, default=2.0)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4], help="N of the CUDA thread arms")
    parser.add_argument("--cpu-workers", type=int, nargs="+", default=[1, 4, 8], help="N of the CPU process arms")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--data-root", type=Path, required=True)
    parser.add_argument("--results-dir", type=Path, default=RESULTS)
    parser.add_argument("--commit", default="", help="the commit the tree was copied from (no .git on the machine)")
    parser.add_argument("--out", default="gpu")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    environment = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
    }
    print(json.dumps(environment), flush=True)
    start = time.perf_counter()
    result: dict[str, Any] = {
        "command": " ".join(["python3", "-m", "benchmarks.distributed.gpu", *(argv or sys.argv[1:])]),
        "commit": args.commit,
        "environment": environment,
        "rate_factor": args.rate_factor,
        "repeats": args.repeats,
        "results": [],
    }
    for model in args.models:
        items = args.items // 2 if model == "resnet18" else args.items
        try:
            res = measure(model, items, args.warm, args.repeats, args.rate_factor, args.workers, args.cpu_workers,
                          args.data_root, device)
        except Exception as exc:  # keep the other models' rows
            res = {"model": model, "dataset": CASES[model][0], "items": items, "arms": {},
                   "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc(limit=8)}
            print(res["traceback"], flush=True)
        result["results"].append(res)
        result["seconds"] = time.perf_counter() - start
        print(table([res]), flush=True)
        write_result(args.results_dir, args.out, result, render)
    return 0


if __name__ == "__main__":
    sys.exit(main())
