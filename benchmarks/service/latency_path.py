"""Where the prediction latency's tail goes: one service run with the record-path trace on
(``services/trainer/path_trace.py``), split per record into the Kafka hop + loop backlog, the wait for the
batch's earlier records, the prediction call, and building/producing the Prediction; plus the loop's pauses.

    .venv/bin/python -m benchmarks.service.latency_path --model mnistnet --rate 103 --seconds 40
        # → results/latency_path-<model>[-<tag>].{md,json}

The first 10 s (warm-up, as in latency.py) are reported apart. ``--tag`` names a variant (e.g. a code
change under test) in the output file; ``--env K=V`` passes more FERRET_* settings to the trainer.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.service import harness as h
from services.trainer.path_trace import TRACE_ENV

COMMAND = "python -m benchmarks.service.latency_path"
WARMUP_S = 10.0
SEGMENTS = {
    "latency (published − event)": ("event", "published"),
    "hop + loop backlog (fetched − event)": ("event", "fetched"),
    "batch's earlier records (arrive − fetched)": ("fetched", "arrive"),
    "prediction call (predicted − arrive)": ("arrive", "predicted"),
    "publish (published − predicted)": ("predicted", "published"),
}


def analyse(lines: list[dict[str, Any]]) -> dict[str, Any]:
    records = [r for r in lines if "published" in r and "arrive" in r]
    pauses = [r for r in lines if "pause" in r]
    origin = min(r["event"] for r in records)
    steady = [r for r in records if r["event"] >= origin + WARMUP_S * 1000]
    warm = [r for r in records if r["event"] < origin + WARMUP_S * 1000]
    out: dict[str, Any] = {"records": len(records), "steady": {}, "warmup": {}}
    for name, group in (("steady", steady), ("warmup", warm)):
        for seg, (a, b) in SEGMENTS.items():
            out[name][seg] = h.summary([r[b] - r[a] for r in group])
        out[name]["batch size"] = h.summary([float(r["batch"]) for r in group])
    # the slowest 1 % of steady records: which segment dominates each
    steady.sort(key=lambda r: r["published"] - r["event"])
    tail = steady[-max(1, len(steady) // 100) :]
    dominant: dict[str, int] = {}
    for r in tail:
        parts = {seg: r[b] - r[a] for seg, (a, b) in list(SEGMENTS.items())[1:]}
        top = max(parts, key=lambda k: parts[k])
        dominant[top] = dominant.get(top, 0) + 1
    out["tail_items"] = len(tail)
    out["tail_dominant_segment"] = dominant
    out["tail_mean_segments_ms"] = {seg: sum(r[b] - r[a] for r in tail) / len(tail) for seg, (a, b) in SEGMENTS.items()}
    out["pauses"] = [{"at_s": round((p["at"] - origin) / 1000, 2), "ms": p["pause"], "what": p["what"]} for p in pauses]
    out["warmup_by_time"] = warmup_by_time(warm, origin)
    out["skipped"] = {k: sum(1 for r in steady if r.get("skipped") == k) for k in {r.get("skipped") for r in steady}}
    return out


WARMUP_BUCKETS_S = (0.0, 0.5, 1.0, 2.0, 5.0, WARMUP_S)


def warmup_by_time(warm: list[dict[str, Any]], origin: float) -> list[dict[str, Any]]:
    """Where the warm-up's tail is: the warm-up records by event time after the stream's first one, per
    bucket the records, latency p50 / p99 / max and the mean of every segment (ms)."""
    rows = []
    for lo, hi in itertools.pairwise(WARMUP_BUCKETS_S):
        group = [r for r in warm if lo * 1000 <= r["event"] - origin < hi * 1000]
        if not group:
            continue
        latency = h.summary([r["published"] - r["event"] for r in group])
        means = {seg: sum(r[b] - r[a] for r in group) / len(group) for seg, (a, b) in list(SEGMENTS.items())[1:]}
        rows.append({"from_s": lo, "to_s": hi, "records": len(group), "latency": latency, "mean_segments_ms": means})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="mnistnet")
    parser.add_argument("--rate", type=float, required=True)
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--tag", default="")
    parser.add_argument("--env", action="append", default=[], metavar="K=V")
    args = parser.parse_args()
    trace = Path(tempfile.mkdtemp(prefix="ferret-trace-")) / "trace.jsonl"
    os.environ[TRACE_ENV] = str(trace)
    for item in args.env:
        key, value = item.split("=", 1)
        os.environ[key] = value
    dataset = h.mnist()
    load_before = h.load_average()
    with h.running_service(args.model, kafka_properties=h.KAFKA_CONFIGS["shipped"]) as (service, reader, sampler):
        items = round(args.rate * args.seconds)
        started = time.monotonic()
        report = service.producer(dataset, args.rate, items, "path").run()
        complete = reader.wait_for("path", report.produced, 60)
        cpu = h.cpu_shares(sampler.between(started, time.monotonic()))
        preds = reader.get("path")
    load_after = h.load_average()
    lines = [json.loads(line) for line in trace.read_text().splitlines() if line.strip()]
    result = {
        "command": COMMAND
        + f" --model {args.model} --rate {args.rate:g} --seconds {args.seconds:g}"
        + (f" --tag {args.tag}" if args.tag else "")
        + "".join(f" --env {e}" for e in args.env),
        "tag": args.tag,
        "model": args.model,
        "rate": args.rate,
        "produced": report.produced,
        "read_back": len(preds),
        "complete": complete,
        "start_plan": service.plan,
        "cpu": cpu,
        "load_average": {"before": load_before, "after": load_after},
        **analyse(lines),
    }
    name = f"latency_path-{args.model}" + (f"-{args.tag}" if args.tag else "")
    (h.RESULTS / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
    md = [
        f"# Record-path latency split: {args.model} at {args.rate:g}/s ({args.tag or 'as committed'})",
        "",
        f"Command: `{result['command']}` — load average before {load_before}, after {load_after}; "
        f"{len(preds):,} of {report.produced:,} predictions read back; CPU (cores) {cpu}.",
        "",
        "| segment (ms) | steady p50 | p90 | p99 | max | warm-up p99 |",
        "|---|---|---|---|---|---|",
    ]
    for seg in [*SEGMENTS, "batch size"]:
        s, w = result["steady"][seg], result["warmup"][seg]
        md.append(f"| {seg} | {s['p50']:.1f} | {s['p90']:.1f} | {s['p99']:.1f} | {s['max']:.1f} | {w['p99']:.1f} |")
    md += [
        "",
        f"Slowest 1 % of steady records ({result['tail_items']}): dominant segment {result['tail_dominant_segment']}; "
        "mean ms per segment "
        + ", ".join(f"{k.split(' (')[0]} {v:.1f}" for k, v in result["tail_mean_segments_ms"].items())
        + ".",
        "",
        f"Loop pauses: {result['pauses'] or 'none'}. Steady decisions: {result['skipped']} (None = dispatched).",
        "",
        "Warm-up by event time after the stream's first record (where its tail is; segment means in ms):",
        "",
        "| event time | records | p50 | p99 | max | " + " | ".join(s.split(" (")[0] for s in list(SEGMENTS)[1:]) + " |",
        "|---|---|---|---|---|" + "---|" * (len(SEGMENTS) - 1),
    ]
    for row in result["warmup_by_time"]:
        lat = row["latency"]
        md.append(
            f"| {row['from_s']:g}–{row['to_s']:g} s | {row['records']} | {lat['p50']:.1f} | {lat['p99']:.1f} | "
            f"{lat['max']:.1f} | " + " | ".join(f"{v:.1f}" for v in row["mean_segments_ms"].values()) + " |"
        )
    (h.RESULTS / f"{name}.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
