"""Read the record-path traces of live runs: where a digits/MLP item's time goes against the admission rule's
belief (issue 7j).

Run a live benchmark with ``FERRET_TRACE_RECORD_PATH=/tmp/trace/t-{pid}.jsonl`` (one file per trainer
process, ``services/trainer/path_trace.py``): every record's line carries the admission's view of worker 0
when it was published (``WallClock.admission_view``: the service time s the rule believes, W, the real
queue's bound and length, the executors' action seconds and the seconds charged to ``ServiceTimes``) and
the loop thread's CPU time. Then

    .venv/bin/python -m benchmarks.live.admission_trace /tmp/trace/*.jsonl

prints per run (the last ``--items`` records: the measured stream, after the warm-up) how busy the worker
was over the stream's event-time span, the real action time per trained item against the believed service
time, the real queue and the loop thread's CPU per item, per block of 100 items.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics as st


def report(path: str, items: int) -> list[str]:
    with open(path) as lines:
        rows = [json.loads(line) for line in lines]
    m = [r for r in rows if "event" in r][-items:]
    if len(m) < 2 or "executor_s" not in m[0]:
        return [f"{os.path.basename(path)}: no admission view in the trace (a trace from before issue 7j?)"]
    trained = sum(r["skipped"] is None for r in m)
    action = m[-1]["executor_s"] - m[0]["executor_s"]
    charged = m[-1]["charged_s"] - m[0]["charged_s"]
    span = (m[-1]["event"] - m[0]["event"]) / 1000
    cpu = (m[-1]["cpu"] - m[0]["cpu"]) / len(m)
    pauses = [(r["pause"], r["what"]) for r in rows if "pause" in r]
    out = [
        f"{os.path.basename(path)}: {len(m)} items over {span:.2f} s of event time, {trained} trained; worker "
        f"actions {action:.3f} s (busy {100 * action / span:.0f} % of the span), charged {charged:.3f} s; "
        f"{1000 * action / max(1, trained):.3f} ms of actions per trained item; loop thread CPU "
        f"{cpu:.3f} ms per item; pauses {pauses}",
        "| items | trained | s believed, ms (median) | actions per trained item, ms | real queue (mean) | "
        "loop CPU ms/item | fetched − event p50 ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for k in range(0, len(m), 100):
        seg = m[k : k + 100]
        nxt = m[min(k + 100, len(m) - 1)]
        tr = sum(r["skipped"] is None for r in seg)
        act = nxt["executor_s"] - seg[0]["executor_s"]
        out.append(
            f"| {k}–{k + len(seg) - 1} | {tr} | {1000 * st.median(r['service_s'] for r in seg):.2f} | "
            f"{1000 * act / max(1, tr):.2f} | {st.mean(r['waiting'] for r in seg):.1f} | "
            f"{(nxt['cpu'] - seg[0]['cpu']) / len(seg):.3f} | {st.median(r['fetched'] - r['event'] for r in seg):.1f} |"
        )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="+")
    parser.add_argument("--items", type=int, default=1000, help="the measured stream's items (the last ones)")
    args = parser.parse_args()
    for path in sorted(args.traces, key=os.path.getmtime):
        print("\n".join(report(path, args.items)), end="\n\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
