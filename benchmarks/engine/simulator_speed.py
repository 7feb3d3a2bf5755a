"""Simulator speed (issue 11): items/s of ``ferret simulate --method oracle`` ÷ items/s of a plain PyTorch
loop doing the same work on the same items, idle and with another busy process on the machine.

``ferret simulate --dataset mnist --model mnistnet --method oracle --items N --json`` runs in this
process (``services.cli.main.main``, stdout captured); its items/s is ``items / wall_seconds`` of the JSON
(the stream phase: prediction at arrival, F, B, U through the engine, memory sampled after every action,
trace kept; loading the data and the final test accuracy are not in it). The plain loop streams the same
items (``iter_stream``) through an ordinary module: prediction, then forward, backward and an in-place
SGD step — the work Oracle does per item. Both use the simulator's default of one torch thread with
denormals flushed. Each condition alternates the two ``--repeats`` times and reports the median of the
per-repeat ratios. The ``busy`` condition runs a spinning ``python -c 'while True: pass'`` during its
runs (started and stopped by this script). For reference, the busy condition also times simulate with
``--threads 2`` (torch's default here, what `ferret simulate` used before issue 11).

    /work/tools/timed .venv/bin/python -m benchmarks.engine.simulator_speed --items 1000 --repeats 3
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from ferret_core.data import iter_stream, load_dataset
from ferret_core.zoo import build_model
from services.cli.main import main as ferret

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
RESULTS = HERE / "results"
PROFILE = HERE.parent / "profiles" / "mnistnet.json"
DATA = ROOT.parent / "shared" / "data"
LR = 1e-3


def simulate(items: int, threads: int) -> dict[str, Any]:
    out = io.StringIO()
    argv = [
        "simulate",
        "--dataset",
        "mnist",
        "--model",
        "mnistnet",
        "--method",
        "oracle",
        "--items",
        str(items),
        "--profile",
        str(PROFILE),
        "--data-root",
        str(DATA),
        "--threads",
        str(threads),
        "--json",
    ]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = ferret(argv)
    if code != 0:
        raise SystemExit(f"ferret simulate failed with exit status {code}")
    report = json.loads(out.getvalue())
    return {"items_per_s": report["items"] / report["wall_seconds"], "oacc": report["oacc"], "threads": threads}


def plain(items: int) -> dict[str, Any]:
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    ds = load_dataset("mnist", DATA, seed=0)
    net = copy.deepcopy(build_model("mnistnet", seed=0).as_sequential())
    params = list(net.parameters())
    correct = 0
    started = time.perf_counter()
    for item in iter_stream(ds, limit=items):
        x = item.x.unsqueeze(0)
        with torch.no_grad():
            correct += int(net(x).argmax(1).item() == item.y)
        loss = F.cross_entropy(net(x), torch.tensor([item.y]))
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for p, g in zip(params, grads, strict=True):
                p.sub_(g, alpha=LR)
    seconds = time.perf_counter() - started
    return {"items_per_s": items / seconds, "oacc": 100.0 * correct / items}


def condition(items: int, repeats: int, busy: bool) -> dict[str, Any]:
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
    try:
        time.sleep(0.5 if busy else 0.0)
        runs = []
        for repeat in range(repeats):
            order = ("simulate", "plain") if repeat % 2 == 0 else ("plain", "simulate")
            run: dict[str, Any] = {}
            for what in order:
                run[what] = simulate(items, 1) if what == "simulate" else plain(items)
            run["ratio"] = run["simulate"]["items_per_s"] / run["plain"]["items_per_s"]
            runs.append(run)
        unpinned = simulate(items, 2) if busy else None
    finally:
        if spinner is not None:
            spinner.terminate()
            spinner.wait()
    return {
        "busy": busy,
        "runs": runs,
        "median_ratio": statistics.median(r["ratio"] for r in runs),
        "simulate_items_per_s": statistics.median(r["simulate"]["items_per_s"] for r in runs),
        "plain_items_per_s": statistics.median(r["plain"]["items_per_s"] for r in runs),
        "simulate_2_threads_items_per_s": None if unpinned is None else unpinned["items_per_s"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    load_before = os.getloadavg()
    rows = [condition(args.items, args.repeats, busy) for busy in (False, True)]
    load_after = os.getloadavg()
    command = (
        f"/work/tools/timed .venv/bin/python -m benchmarks.engine.simulator_speed --items {args.items} "
        f"--repeats {args.repeats}"
    )
    lines = [
        "| condition | simulate items/s (1 thread) | plain loop items/s | **ratio** (median of repeats) "
        "| per-repeat ratios | simulate items/s with 2 threads |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        two = r["simulate_2_threads_items_per_s"]
        ratios = ", ".join(f"{x['ratio']:.2f}" for x in r["runs"])
        lines.append(
            f"| {'another process spinning' if r['busy'] else 'idle'} | {r['simulate_items_per_s']:.1f} | "
            f"{r['plain_items_per_s']:.1f} | **{r['median_ratio']:.2f}** | "
            f"{ratios} | {'–' if two is None else f'{two:.1f}'} |"
        )
    text = (
        f"`ferret simulate --method oracle` (MNISTNet / MNIST, {args.items} items, memory sampled after every "
        f"action) ÷ a plain PyTorch loop on the same items; goal ≥ 0.8. Load average {load_before[0]:.2f} before, "
        f"{load_after[0]:.2f} after. Command: `{command}`.\n\n" + "\n".join(lines) + "\n"
    )
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "simulator_speed.md").write_text(text)
    payload = {"command": command, "load_before": load_before, "load_after": load_after, "conditions": rows}
    (RESULTS / "simulator_speed.json").write_text(json.dumps(payload, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
