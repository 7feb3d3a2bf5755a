"""Every method of the registry, and every OCL algorithm under 1-Skip, Last-N and Ferret, on a class-
incremental stream: 5000 ``split-mnist`` items (1000 from each of its 5 tasks), MNISTNet, the paper's
rate t^d = max_i t̂_i^f of ``benchmarks/profiles/mnistnet-batches.json`` (which also times mini-batches).

Each row is the CLI itself (``python -m services.cli.main simulate ... --json``); the command is stored
with its report. Part ``methods``: every name in :data:`ferret_core.engine.METHOD_NAMES` at the time of
the run (the list comes from the registry, so methods added later are picked up), vanilla, each with its
defaults (Ferret: unconstrained plan M+, Iter-Fisher). Part ``algorithms``: every name in
:data:`ferret_core.ocl.ALGORITHM_NAMES` under ``1-skip`` (the baseline of agm), ``last-n`` and ``ferret``
(M+, planned for the algorithm's step; no compensation here, so that compensation's cost and effect stay
out of the comparison of algorithms). A method that fails is recorded with its error, not dropped.

    .venv/bin/python -m benchmarks.methods.compare_methods            # → results/methods.{md,json}
    .venv/bin/python -m benchmarks.methods.compare_methods --table-only   # re-render the tables from the JSON
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ferret_core.engine import METHOD_NAMES
from ferret_core.metrics import agm, tagm
from ferret_core.ocl import ALGORITHM_NAMES

ROOT = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).resolve().parent / "results"
PROFILE = Path("benchmarks/profiles/mnistnet-batches.json")
DATASET, MODEL = "split-mnist", "mnistnet"
ALGORITHM_METHODS = ("1-skip", "last-n", "ferret")
# the paper's Table 1, SplitMNIST/MNISTNet row: agm vs 1-Skip
PAPER_AGM = {
    "oracle": 18.21,
    "random-n": 2.34,
    "last-n": 2.37,
    "camel": 3.3,
    "ferret M-": 6.11,
    "ferret M": 14.55,
    "ferret M+": 17.05,
}


def run_simulate(method: str, algorithm: str, items: int, extra: list[str]) -> dict[str, Any]:
    cmd = [
        sys.executable,
        "-m",
        "services.cli.main",
        "simulate",
        "--dataset",
        DATASET,
        "--model",
        MODEL,
        "--method",
        method,
        "--algorithm",
        algorithm,
        "--items",
        str(items),
        "--profile",
        str(PROFILE),
        "--json",
        *extra,
    ]
    command = " ".join(["ferret", *cmd[3:]])
    started = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        error = (done.stderr.strip().splitlines() or ["(no message)"])[-1]
        print(f"{method} + {algorithm}: FAILED ({done.returncode}): {error}", file=sys.stderr, flush=True)
        return {
            "method": method,
            "algorithm": algorithm,
            "command": command,
            "error": error,
            "process_seconds": seconds,
        }
    report: dict[str, Any] = json.loads(done.stdout)
    report["command"] = command
    report["process_seconds"] = seconds
    r = report
    print(
        f"{method:<10} {algorithm:<8} oacc {r['oacc']:6.2f}  tacc {r['tacc']:6.2f}  trained {r['trained']:5d}  "
        f"peak {r['peak_bytes'] / 2**20:8.2f} MiB  {seconds:6.1f} s",
        file=sys.stderr,
        flush=True,
    )
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=5000)
    parser.add_argument("--part", choices=("all", "methods", "algorithms"), default="all")
    parser.add_argument("--table-only", action="store_true", help="re-render results/methods.md from the JSON")
    parser.add_argument(
        "--methods",
        nargs="+",
        choices=METHOD_NAMES,
        default=None,
        help="with --part methods: run only these and replace their rows in the existing JSON (default: every method)",
    )
    args = parser.parse_args()
    path = RESULTS / "methods.json"
    if args.table_only:
        summary = json.loads(path.read_text())
    else:
        summary = json.loads(path.read_text()) if path.exists() and args.part != "all" else {}
        summary.update(items=args.items, dataset=DATASET, model=MODEL, profile=str(PROFILE))
        if args.part in ("all", "methods"):
            load = [os.getloadavg()[0]]
            chosen = args.methods or METHOD_NAMES
            fresh = {m: run_simulate(m, "vanilla", args.items, []) for m in chosen}
            kept = {r["method"]: r for r in summary.get("methods", [])} if args.methods else {}
            summary["methods"] = [fresh.get(m) or kept[m] for m in METHOD_NAMES if m in fresh or m in kept]
            summary["load_average_methods"] = [*load, os.getloadavg()[0]]
        if args.part in ("all", "algorithms"):
            load = [os.getloadavg()[0]]
            summary["algorithms"] = [
                run_simulate(m, a, args.items, ["--compensator", "none"] if m == "ferret" else [])
                for a in ALGORITHM_NAMES
                for m in ALGORITHM_METHODS
            ]
            summary["load_average_algorithms"] = [*load, os.getloadavg()[0]]
        RESULTS.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(summary, indent=2) + "\n")
    text = tables(summary)
    (RESULTS / "methods.md").write_text(text + "\n")
    print(text)


def tables(summary: dict[str, Any]) -> str:
    methods = summary.get("methods", [])
    algorithms = summary.get("algorithms", [])
    first = next((r for r in methods + algorithms if "error" not in r), None)
    rate = "?" if first is None else f"{first['arrival_interval'] * 1e3:.4g} ms"
    lines = [
        f"{summary['dataset']} / {summary['model']}, {summary['items']} items (an equal share of each of the 5 "
        f"tasks, in task order), t^d = max_i t̂_i^f = {rate} ({summary['profile']}), SGD lr 1e-3, seed 0; load "
        f"average {_load(summary, 'methods')} (methods), {_load(summary, 'algorithms')} (algorithms). Memory: the "
        "engine's measured peak. agm/tagm against 1-Skip (DESIGN §3.2). tacc: the held-out split at the end; by task: "
        "the final accuracy on each task's first 500 held-out items; forgetting: mean drop from a task's best "
        "accuracy at a task boundary to its final one.",
        "",
        "### Methods (vanilla)",
        "",
    ]
    lines += _table(methods, key="method")
    lines += [
        "",
        "Paper (Table 1, SplitMNIST/MNISTNet, agm vs 1-Skip): "
        + ", ".join(f"{k} {v}" for k, v in PAPER_AGM.items())
        + ".",
        "",
    ]
    lines += ["### OCL algorithms under 1-Skip, Last-N and Ferret (M+, no compensation)", ""]
    lines += _table(algorithms, key="algorithm")
    return "\n".join(lines)


def _load(summary: dict[str, Any], part: str) -> str:
    values = summary.get(f"load_average_{part}") or summary.get("load_average") or []
    return " → ".join(f"{v:.2f}" for v in values) or "?"


def _table(rows: list[dict[str, Any]], *, key: str) -> list[str]:
    out = [
        "| method | algorithm | plan | oacc % | tacc % | forgetting | final tacc by task % | trained | skipped "
        "| measured peak MiB | planned MiB | peak ÷ 1-Skip | agm vs 1-Skip | tagm vs 1-Skip | compute s |",
        "|" + "---|" * 15,
    ]
    baselines = {r["algorithm"]: r for r in rows if r.get("method") == "1-skip" and "error" not in r}
    for r in rows:
        if "error" in r:
            out.append(f"| {r['method']} | {r['algorithm']} | failed: {r['error']} |" + " |" * 12)
            continue
        base = baselines.get(r["algorithm"] if key == "algorithm" else "vanilla")
        plan = r.get("plan")
        shape = "1 × 1/1" if plan is None else f"{plan['num_stages']} × {plan['live_workers']}/{plan['num_workers']}"
        tasks = r.get("task_accuracy") or {}
        forgetting = tasks.get("forgetting")
        by_task = " / ".join(f"{v:.0f}" for v in tasks.get("final_by_task", []))
        skipped = ", ".join(f"{k} {v}" for k, v in r["skipped"].items() if v) or "–"
        planned = "–" if r["planned_bytes"] is None else f"{r['planned_bytes'] / 2**20:.2f}"
        if base is None:
            ratio = gain = tgain = "–"
        else:
            ratio = f"{r['peak_bytes'] / base['peak_bytes']:.2f}"
            gain = f"{agm(r['oacc'], base['oacc'], r['peak_bytes'], base['peak_bytes']):.2f}"
            tgain = f"{tagm(r['tacc'], base['tacc'], r['peak_bytes'], base['peak_bytes']):.2f}"
        out.append(
            f"| {r['method']} | {r['algorithm']} | {shape} | {r['oacc']:.2f} | {r['tacc']:.2f} | "
            f"{'–' if forgetting is None else f'{forgetting:.1f}'} | {by_task} | {r['trained']} | {skipped} | "
            f"{r['peak_bytes'] / 2**20:.2f} | {planned} | {ratio} | {gain} | {tgain} | {r['wall_seconds']:.0f} |"
        )
    return out


if __name__ == "__main__":
    main()
