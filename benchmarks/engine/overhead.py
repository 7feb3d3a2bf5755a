"""(a) Engine overhead: Oracle through the engine versus a plain PyTorch loop doing the same predictions
and SGD updates on the same MNIST items (MNISTNet, one torch thread, batch 1).

The two are interleaved *item by item* in one process: the engine pulls its stream from a generator
that, before handing over item i, runs the plain loop's prediction and update of item i under its own
CPU-time accumulator. So load from other processes (this machine's 2 cores are shared) hits both alike,
and one run gives the ratio engine CPU seconds / plain CPU seconds. Both must end with bit-identical
parameters and the same online accuracy (checked). Variants: ``default`` = the engine as ``ferret
simulate`` runs it (memory sampled after every action, trace kept and validated at the end); ``lean`` =
memory measurement and validation off. Each variant runs ``--repeats`` times; the median ratio is the
result (all ratios are kept).

Interleaving makes the two share the caches item by item (two models' weights and gradients), which
costs both of them time; ``--mode separate`` instead runs whole streams one after the other (plain,
default, lean, repeated) and reports the ratios of the minima and of the medians — less interference
between the two, more from the rest of the machine.

    .venv/bin/python -m benchmarks.engine.overhead --items 5000 --repeats 3
    .venv/bin/python -m benchmarks.engine.overhead --items 5000 --repeats 5 --mode separate
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from ferret_core.data import iter_stream, load_dataset
from ferret_core.engine import EngineSettings, Oracle, StreamEngine
from ferret_core.zoo import ZooModel, build_model

ROOT = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).resolve().parent / "results"
LR = 1e-3


class PlainLoop:
    """Predict, then one in-place SGD step per item, on an ordinary module (the reference)."""

    def __init__(self, model: ZooModel) -> None:
        self.net = copy.deepcopy(model.as_sequential())
        self.params = list(self.net.parameters())
        self.correct = 0
        self.cpu = 0.0

    def step(self, item: Any) -> None:
        started = time.process_time()
        x = item.x.unsqueeze(0)
        with torch.no_grad():
            self.correct += int(self.net(x).argmax(1).item() == item.y)
        loss = F.cross_entropy(self.net(x), torch.tensor([item.y]))
        grads = torch.autograd.grad(loss, self.params)
        with torch.no_grad():
            for p, g in zip(self.params, grads, strict=True):
                p.sub_(g, alpha=LR)
        self.cpu += time.process_time() - started


def interleaved(model: ZooModel, items: list[Any], lean: bool) -> dict[str, Any]:
    plain = PlainLoop(model)

    def stream() -> Iterator[Any]:
        for item in items:
            plain.step(item)
            yield item

    setup = Oracle().setup(model.name, model.num_units, 1.0)
    engine = StreamEngine(model.units, setup, EngineSettings(lr=LR, measure_memory=not lean, validate=not lean))
    wall, cpu = time.perf_counter(), time.process_time()
    result = engine.run_virtual(stream(), None, 1.0)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    engine_cpu = cpu - plain.cpu
    params = [t for state in engine.pipeline.master_state() for t in state.values()]
    identical = all(torch.equal(a, b.detach()) for a, b in zip(params, plain.params, strict=True))
    plain_oacc = 100.0 * plain.correct / len(items)
    if not identical or result.oacc != plain_oacc:
        raise SystemExit(f"engine and plain loop disagree: identical params {identical}, oacc {result.oacc} "
                         f"vs {plain_oacc}")
    return {"plain_cpu_s": plain.cpu, "engine_cpu_s": engine_cpu, "ratio": engine_cpu / plain.cpu,
            "wall_s_both": wall, "oacc": result.oacc, "peak_bytes": result.peak_bytes}


def separate(model: ZooModel, items: list[Any], lean: bool | None) -> float:
    """CPU seconds of one whole stream: the plain loop (``lean`` None) or the engine."""
    if lean is None:
        plain = PlainLoop(model)
        for item in items:
            plain.step(item)
        return plain.cpu
    setup = Oracle().setup(model.name, model.num_units, 1.0)
    engine = StreamEngine(model.units, setup, EngineSettings(lr=LR, measure_memory=not lean, validate=not lean))
    started = time.process_time()
    engine.run_virtual(items, None, 1.0)
    return time.process_time() - started


def main_separate(args: argparse.Namespace, model: ZooModel, items: list[Any]) -> None:
    runs: dict[str, list[float]] = {"plain": [], "default": [], "lean": []}
    for r in range(args.repeats):
        for variant, lean in (("plain", None), ("default", False), ("lean", True)):
            runs[variant].append(separate(model, items, lean))
        print(f"repeat {r}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in runs.items()), flush=True)
    report = {
        "mode": "separate",
        "items": args.items,
        "repeats": args.repeats,
        "load_average_1min_at_end": _load_average(),
        "cpu_s": runs,
        "ratio_of_minima": {k: min(runs[k]) / min(runs["plain"]) for k in ("default", "lean")},
        "ratio_of_medians": {k: statistics.median(runs[k]) / statistics.median(runs["plain"])
                             for k in ("default", "lean")},
        "goal": 1.10,
    }
    out = args.out.with_name("overhead_separate.json")
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: report[k] for k in ("ratio_of_minima", "ratio_of_medians")}, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--data-root", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--out", type=Path, default=RESULTS / "overhead.json")
    parser.add_argument("--mode", choices=("interleaved", "separate"), default="interleaved")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    items = list(iter_stream(load_dataset("mnist", args.data_root), limit=args.items))
    model = build_model("mnistnet", seed=0)
    interleaved(model, items[:50], lean=False)  # warm-up (lazy initialisation of autograd paths)
    if args.mode == "separate":
        main_separate(args, model, items)
        return
    runs: dict[str, list[dict[str, Any]]] = {"default": [], "lean": []}
    for r in range(args.repeats):
        for variant in runs:
            runs[variant].append(interleaved(model, items, lean=variant == "lean"))
            row = runs[variant][-1]
            print(f"repeat {r} {variant:<8} plain {row['plain_cpu_s']:6.2f} s  engine {row['engine_cpu_s']:6.2f} s"
                  f"  ratio {row['ratio']:.3f}", flush=True)
    report = {
        "items": args.items,
        "repeats": args.repeats,
        "model": "mnistnet",
        "torch": torch.__version__,
        "python": platform.python_version(),
        "threads": torch.get_num_threads(),
        "load_average_1min_at_end": _load_average(),
        "runs": runs,
        "median_ratio": {k: statistics.median(r["ratio"] for r in v) for k, v in runs.items()},
        "ms_per_item_median": {
            "plain": 1e3 * statistics.median(r["plain_cpu_s"] for v in runs.values() for r in v) / args.items,
            **{k: 1e3 * statistics.median(r["engine_cpu_s"] for r in v) / args.items for k, v in runs.items()},
        },
        "identical_parameters_and_oacc": True,
        "goal": 1.10,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: report[k] for k in ("median_ratio", "ms_per_item_median")}, indent=2))


def _load_average() -> float | None:
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except OSError:
        return None


if __name__ == "__main__":
    main()
