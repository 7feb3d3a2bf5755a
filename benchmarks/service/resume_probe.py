"""How late a consumer fetches again after ``pause()`` / ``resume()`` (issue 7k (B)): the trainer pauses
its partitions while a re-plan or snapshot runs on the loop thread (DESIGN §4), and its record-path trace
showed the stream's records fetched ~1 s late after the start-up re-plan's 9-ms pause
(``results/resume_probe.md`` has the librdkafka debug lines).

One embedded broker; per case and repeat a fresh topic, a producer at ``--rate`` records/s on a thread, and
a consumer with the trainer's fetch settings (``fetch.wait.max.ms`` 10, ``consume(256, 0)`` then
``consume(1, 0.05)`` as the loop reads) assigned to it. After 1 s of steady stream the consumer is paused
for ``--pause-ms`` (the loop not consuming meanwhile, as during a loop call), then resumed by the case's
method; reported: the largest produce → receipt delay in the second after the resume and the time from
the resume to the first record received. Cases:

- ``resume``: ``pause()`` … ``resume()`` (the trainer as committed);
- ``resume+wake``: the same, then :func:`services.kafka.fetch_wake.wake_fetcher` (the fix);
- ``no-pause``: the consumer only not read for the same time (no ``pause()``).

    .venv/bin/python -m benchmarks.service.resume_probe --repeats 4    # → results/resume_probe.{md,json}
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import uuid
from typing import Any

from confluent_kafka import OFFSET_END, Consumer, Producer, TopicPartition

from benchmarks.service import harness as h
from services.kafka.admin import ensure_topics
from services.kafka.fetch_wake import wake_fetcher
from services.localstack import LocalStack
from services.trainer.stream import CONSUMER_DEFAULTS

CASES = ("resume", "resume+wake", "no-pause")


def one(bootstrap: str, case: str, rate: float, pause_ms: float) -> dict[str, Any]:
    prefix = f"rp{uuid.uuid4().hex[:6]}"
    ensure_topics(bootstrap, prefix)
    topic = f"{prefix}.samples"
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{prefix}", **CONSUMER_DEFAULTS})
    tps = [TopicPartition(topic, 0, OFFSET_END)]
    consumer.assign(tps)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    stop = threading.Event()

    def produce() -> None:
        i = 0
        while not stop.is_set():
            producer.produce(topic, value=f"{i},{time.time()}".encode())
            producer.poll(0)
            i += 1
            time.sleep(1 / rate)
        producer.flush(5)

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    got: list[tuple[float, float]] = []  # (sent, received) wall s

    def read_for(seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            batch = consumer.consume(256, 0) or consumer.consume(1, 0.05)
            now = time.time()
            got.extend((float(m.value().split(b",")[1]), now) for m in batch if m.error() is None)

    read_for(1.0)
    paused_at = time.time()
    if case != "no-pause":
        consumer.pause(consumer.assignment())
    time.sleep(pause_ms / 1000)
    if case != "no-pause":
        consumer.resume(consumer.assignment())
    if case == "resume+wake":
        wake_fetcher(consumer)
    resumed_at = time.time()
    before = len(got)
    read_for(1.0)
    stop.set()
    thread.join()
    consumer.close()
    after = got[before:]
    first = min((r for _, r in after), default=float("nan"))
    window = [(r - s) * 1000 for s, r in after if s <= resumed_at + 1.0]
    steady = [(r - s) * 1000 for s, r in got[:before] if s >= paused_at - 0.8]
    return {
        "case": case,
        "resume_to_first_record_ms": round((first - resumed_at) * 1000, 1),
        "max_delay_after_resume_ms": round(max(window, default=float("nan")), 1),
        "p50_delay_after_resume_ms": round(h.quantile(window, 0.5), 1) if window else None,
        "max_delay_before_pause_ms": round(max(steady, default=float("nan")), 1),
        "records_after_resume": len(after),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--rate", type=float, default=84.0)
    parser.add_argument("--pause-ms", type=float, default=10.0)
    args = parser.parse_args(argv)
    load_before, began = h.load_average(), time.monotonic()
    rows = []
    with LocalStack() as stack:
        for r in range(args.repeats):
            for case in CASES[r % len(CASES) :] + CASES[: r % len(CASES)]:  # rotated: no case always first
                row = {"repeat": r, **one(stack.bootstrap_servers, case, args.rate, args.pause_ms)}
                print(json.dumps(row), flush=True)
                rows.append(row)
    payload = {
        "command": "python -m benchmarks.service.resume_probe " + " ".join(sys.argv[1:] if argv is None else argv),
        "commit": h.git_head(),
        "load_before": load_before,
        "load_after": h.load_average(),
        "seconds": round(time.monotonic() - began, 1),
        "rate": args.rate,
        "pause_ms": args.pause_ms,
        "rows": rows,
    }
    md = [
        f"# Fetching again after pause/resume ({args.rate:g} records/s, paused {args.pause_ms:g} ms)",
        "",
        f"Command: `{payload['command']}` at {payload['commit']}; load average {load_before} before, "
        f"{payload['load_after']} after; {payload['seconds']} s. Per case, over {args.repeats} repeats (each a fresh "
        "topic and consumer on one embedded Tansu): ms from the resume to the first record received, and the "
        "largest / median produce → receipt delay of the records sent up to 1 s after the resume (before the "
        "pause: the largest delay over the 0.8 s before it).",
        "",
        "| case | resume → first record ms (each repeat) | max delay after resume ms | p50 after ms | max before ms |",
        "|---|---|---|---|---|",
    ]
    for case in CASES:
        rs = [r for r in rows if r["case"] == case]
        md.append(
            f"| {case} | {', '.join(str(r['resume_to_first_record_ms']) for r in rs)} | "
            f"{', '.join(str(r['max_delay_after_resume_ms']) for r in rs)} | "
            f"{', '.join(str(r['p50_delay_after_resume_ms']) for r in rs)} | "
            f"{', '.join(str(r['max_delay_before_pause_ms']) for r in rs)} |"
        )
    h.write_results("resume_probe", payload, "\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
