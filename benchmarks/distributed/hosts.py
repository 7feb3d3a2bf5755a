"""Process executors over several hosts, on loopback: what the cross-host control path costs against the
same plan on one host and against the plain loop, in one run, and how fresh the predicting copies are.

The job runs as ``--nodes`` ``torchrun`` launchers meeting through c10d rendezvous on 127.0.0.1 (what
separate machines do, :mod:`services.hosts.loopback`); rank 0 coordinates and runs every arm, the other
ranks own stages (:func:`services.hosts.job.serve`). Every arm sees the same real items, the same initial
weights and the same stream at ``--rate-factor`` × the plain loop's capacity:

* **plain capacity, 1 thread** and **plain loop** on the stream (what a user would run instead);
* **process 2 stages × N, one host**: the stages cut where their forward + backward times balance, every
  executor a child of the coordinator, control over pipes;
* **process 2 stages × N, 2 hosts**: the same plan with stage 1 owned by rank 1: its version slots there,
  its executors children of that host's agent, control over ``torch.distributed`` links, predictions on
  the coordinator's follower copy (freshness p50/p99: updates and ms behind the newest announced master).

On one machine the "hosts" share its cores, so this measures the control path's cost, not a speed-up.

    .venv/bin/python -m benchmarks.distributed.hosts                  # → results/hosts-loopback.{md,json}
    .venv/bin/python -m benchmarks.distributed.hosts --models mlp --items 200 --repeats 1
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from benchmarks.distributed.throughput import (
    CASES,
    median_of,
    plain_capacity,
    plain_stream,
    prepare,
    processes,
)
from benchmarks.support import run_record, write_result
from ferret_core.engine.processes.follow import FOLLOW_SHARE
from ferret_core.engine.processes.hosts import Hosts
from services.hosts.job import coordinator_address, join, serve
from services.hosts.loopback import run_on_loopback

RESULTS = Path(__file__).resolve().parent / "results"


def measure(model: str, items: int, warm: int, repeats: int, factor: float, workers: int, root: Path,
            hosts: Hosts) -> dict[str, Any]:
    case = prepare(model, items, warm, workers, root)
    dataset, units, xs, ys, lr, warm_items, cut = (
        case.dataset, case.units, case.xs, case.ys, case.lr, case.warm_items, case.cut
    )
    rows: dict[str, list[dict[str, Any]]] = {}
    for _ in range(repeats):
        cap1 = plain_capacity(units, xs, ys, lr, 1)
        rate = factor * cap1["trained"] / cap1["elapsed_s"]
        arms: dict[str, dict[str, Any]] = {
            "plain capacity, 1 thread": cap1,
            "plain loop": plain_stream(units, xs, ys, lr, rate),
        }
        for n in sorted({1, workers}):
            arms[f"process 2 stages × {n}, one host"] = processes(
                units, model, xs, ys, lr, rate, n, warm_items, 0.0, cut
            )
            hosts.place([0, 1])
            arms[f"process 2 stages × {n}, 2 hosts"] = processes(
                units, model, xs, ys, lr, rate, n, warm_items, 0.0, cut, hosts=hosts
            )
        for name, row in arms.items():
            rows.setdefault(name, []).append({**row, "stream_rate": rate, "per_s": row["trained"] / row["elapsed_s"]})
    return {"model": model, "dataset": dataset, "items": items, "lr": lr, "cut": list(cut), "arms": rows}


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| model / data | arm | trained items/s (median) | ÷ plain loop | ÷ same plan, one host | start-up s | "
        "freshness p50 / p99: updates | freshness p50 / p99: ms |",
        "|---|---|---:|---:|---:|---:|---|---|",
    ]
    for res in results:
        arms = res["arms"]
        plain = median_of(arms["plain loop"], "per_s")
        for name, rows in arms.items():
            per_s = median_of(rows, "per_s")
            one_host = arms.get(name.replace("2 hosts", "one host")) if name.endswith("2 hosts") else None
            vs_one = f"{per_s / median_of(one_host, 'per_s'):.2f}×" if one_host else ""
            start = f"{median_of(rows, 'start_s'):.3f}" if "start_s" in rows[-1] else ""
            fresh = [r["freshness"] for r in rows if "freshness" in r]
            updates = ms = ""
            if fresh:
                updates = f"{median_of(fresh, 'updates_p50'):.0f} / {median_of(fresh, 'updates_p99'):.1f}"
                ms = f"{median_of(fresh, 'ms_p50'):.1f} / {median_of(fresh, 'ms_p99'):.1f}"
            lines.append(
                f"| {res['model']} / {res['dataset']} | {name} | {per_s:.1f} | {per_s / plain:.2f}× | {vs_one} | "
                f"{start} | {updates} | {ms} |"
            )
    return "\n".join(lines)


def render(result: dict[str, Any], args: argparse.Namespace) -> str:
    return (
        f"# Process executors over {args.nodes} hosts on loopback ({args.rate_factor:g}× the plain loop's capacity)\n\n"
        f"Command: `{result['command']}` at {result['commit']}; {result['cpus']} CPUs shared by every host, load "
        f"before {result['load_before'][0]:.2f}; medians of {args.repeats} repeats; follow share "
        f"{args.follow_share:g}; job start to end "
        f"{result.get('job_seconds', float('nan')):.1f} s.\n\n{table(result['results'])}\n"
    )


def coordinate(args: argparse.Namespace, argv: list[str] | None) -> int:
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    if args.data_root is None:
        from services.config.data_root import default_data_root

        args.data_root = default_data_root()
    load = os.getloadavg()
    hosts = Hosts(coordinator_address(), follow_share=args.follow_share)
    try:
        results = []
        for model in args.models:
            items = max(50, args.items // 4) if model == "resnet18" else args.items
            results.append(
                measure(model, items, args.warm, args.repeats, args.rate_factor, args.workers, args.data_root, hosts)
            )
            print(table(results[-1:]), flush=True)
    finally:
        hosts.shutdown()
    peak_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result = run_record("benchmarks.distributed.hosts", argv, load, peak_rss_mib=peak_rss_mib, results=results)
    (RESULTS / f"{args.out}.partial.json").write_text(json.dumps(result))
    dist.destroy_process_group()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["mlp", "mnistnet", "convnet"], choices=list(CASES))
    parser.add_argument("--items", type=int, default=400, help="items per arm (resnet18 uses a quarter)")
    parser.add_argument("--warm", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rate-factor", type=float, default=2.0, help="stream rate ÷ the plain loop's capacity")
    parser.add_argument("--workers", type=int, default=2, help="N of the multi-worker arms")
    parser.add_argument("--nodes", type=int, default=2, help="launchers (hosts) on loopback")
    parser.add_argument("--data-root", type=Path, default=None)
    parser.add_argument(
        "--follow-share", type=float, default=FOLLOW_SHARE, help="the hosts' pace of sending masters (0, 1]"
    )
    parser.add_argument("--out", default="hosts-loopback")
    args = parser.parse_args(argv)
    if "RANK" in os.environ:  # a rank of the job
        return coordinate(args, argv) if join() == 0 else serve()
    run = run_on_loopback(["-m", "benchmarks.distributed.hosts", *(argv or sys.argv[1:])], nodes=args.nodes,
                          timeout=3600, run_id="ferret-bench-hosts")
    partial = RESULTS / f"{args.out}.partial.json"
    if run.codes != [0] * args.nodes or not partial.exists():
        print("\n---\n".join(run.logs), file=sys.stderr)
        return 1
    result = json.loads(partial.read_text())
    partial.unlink()
    result["job_seconds"] = run.seconds
    write_result(RESULTS, args.out, result, lambda r: render(r, args))
    print(table(result["results"]))
    print(json.dumps({"written": str(RESULTS / args.out)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
