"""The demo, A against B: ``ferret demo`` (the local stack, the producer, ``ferret run`` supervised: what a
user runs) repeated in interleaved rounds with one trainer setting changed per arm, paired by round (the same
items at the same rate every run: the demo streams the dataset's first items in order).

Each arm is ``NAME`` or ``NAME:SETTING=VALUE`` (a ``FERRET_…`` variable the trainer reads); the first arm is
the reference, every other is reported as a paired difference from it (mean ± s.e. over the rounds). The arms'
order rotates by one each round, so a drift of the machine falls on every arm alike. Per run: online accuracy,
items trained, latency p50/p99 (event time → prediction), from the demo's ``summary.json``.

    .venv/bin/python -m benchmarks.live.demo_ab --rounds 6 \\
        --arm nice10 --arm nice0:FERRET_TRAINER_RECORD_PATH_NICE=0 --name record_path_nice
        # → results/demo_ab-record_path_nice.{md,json}
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.live.side_by_side import mean_se
from benchmarks.support import ROOT, run_record, write_result

RESULTS = Path(__file__).resolve().parent / "results"
MEASURES = ("online_accuracy", "trained", "latency_ms_p50", "latency_ms_p99")


def parse_arm(text: str) -> tuple[str, dict[str, str]]:
    """``NAME`` or ``NAME:VAR=VALUE[,VAR=VALUE]``."""
    name, _, settings = text.partition(":")
    env = dict(item.split("=", 1) for item in settings.split(",") if item)
    if not name or any(not k.startswith("FERRET_") for k in env):
        raise SystemExit(f"--arm {text!r}: expected NAME or NAME:FERRET_VAR=VALUE[,FERRET_VAR=VALUE]")
    return name, env


def run_demo(items: int, rate: int | None, env: dict[str, str], out: Path) -> dict[str, Any]:
    """One ``ferret demo`` with ``env`` over the environment; its summary's measures and its wall time."""
    cmd = [sys.executable, "-m", "services.cli.main", "demo", "--items", str(items), "--no-plain-consumer"]
    cmd += ["--no-live", "--out", str(out), *(["--rate", str(rate)] if rate else [])]
    started = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    summary = json.loads((out / "summary.json").read_text())
    return {**{m: summary[m] for m in MEASURES}, "rate": summary["rate"], "seconds": time.perf_counter() - started}


def render(result: dict[str, Any]) -> str:
    arms = [a["name"] for a in result["arms"]]
    runs = result["runs"]
    rate = result["rate"] or "the demo’s measured"
    out = [
        f"# The demo, A against B: {', '.join(arms)}",
        "",
        f"Command: `{result['command']}` at {result['commit']}, {result['cpus']} CPUs, load average before "
        f"{result['load_before']}. {result['items']} items per run at {rate} items/s, "
        f"{result['rounds']} rounds, the arms' order rotated each round.",
        "",
        "Arms: " + "; ".join(f"`{a['name']}` {a['env'] or '(the defaults)'}" for a in result["arms"]),
        "",
        "| round | arm | online acc. % | trained | p50 ms | p99 ms |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    for r in runs:
        out.append(
            f"| {r['round']} | {r['arm']} | {r['online_accuracy']:.2f} | {r['trained']} | "
            f"{r['latency_ms_p50']:.0f} | {r['latency_ms_p99']:.0f} |"
        )
    out += ["", f"Paired by round, each arm − `{arms[0]}` (mean ± s.e.):", ""]
    out += ["| arm | online acc. points | trained items | p99 ms |", "|---|---:|---:|---:|"]
    by = {(r["round"], r["arm"]): r for r in runs}
    for arm in arms[1:]:
        cells = []
        for measure in ("online_accuracy", "trained", "latency_ms_p99"):
            diffs = [by[(k, arm)][measure] - by[(k, arms[0])][measure] for k in range(result["rounds"])]
            mean, se = mean_se(diffs)
            cells.append(f"{mean:+.2f} ± {se:.2f}")
        out.append(f"| {arm} | {' | '.join(cells)} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arm", action="append", required=True, help="NAME or NAME:FERRET_VAR=VALUE (≥ 2)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--items", type=int, default=5000)
    parser.add_argument("--rate", type=int, default=385, help="items/s (0: the demo's own, measured at start)")
    parser.add_argument("--name", required=True, help="results/demo_ab-NAME.{md,json}")
    args = parser.parse_args(argv)
    arms = [parse_arm(a) for a in args.arm]
    if len(arms) < 2:
        raise SystemExit("give at least two --arm")
    load_before = os.getloadavg()
    runs = []
    with tempfile.TemporaryDirectory(prefix="demo-ab-") as scratch:
        for k in range(args.rounds):
            for name, env in arms[k % len(arms) :] + arms[: k % len(arms)]:
                found = run_demo(args.items, args.rate or None, env, Path(scratch) / f"{name}-{k}")
                runs.append({"round": k, "arm": name, **found})
                print(json.dumps(runs[-1]), flush=True)
    result = run_record(
        "benchmarks.live.demo_ab",
        argv,
        load_before,
        items=args.items,
        rate=args.rate,
        rounds=args.rounds,
        arms=[{"name": n, "env": e} for n, e in arms],
        runs=runs,
    )
    print(write_result(RESULTS, f"demo_ab-{args.name}", result, render))


if __name__ == "__main__":
    main()
