"""Two properties of the embedded broker (Tansu, memory storage) that shape every service measurement here:

1. **Fetch cost grows with the records held.** One consumer keeps up with a producer at 300 records/s
   (833-byte values, one partition); the broker's CPU is sampled every 10 s, once with librdkafka's default
   ``fetch.wait.max.ms`` (500) and once with 10 ms (what the trainer's consumer uses since commit 37aa77e),
   and once with no consumer.
2. **A fresh idempotent producer's first records wait.** Records sent 20 ms apart by a new client: the
   delivery latency of the first 20, idempotent (the services' setting) and not.

A fresh broker for every case. Writes ``results/broker_effects.{md,json}``.

    .venv/bin/python -m benchmarks.service.broker_effects
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

from confluent_kafka import Consumer, Producer

from benchmarks.service import harness as h
from services.kafka.admin import ensure_topics
from services.localstack import LocalStack

COMMAND = "python -m benchmarks.service.broker_effects"
RATE = 300.0
SECONDS = 60.0
VALUE = b"x" * 833


def fetch_cost(fetch_wait_ms: int | None, consumer: bool = True) -> list[dict[str, float]]:
    rows: list[dict[str, float]] = []
    with LocalStack() as stack:
        ensure_topics(stack.bootstrap_servers, "fx", sample_partitions=1)
        stop = threading.Event()
        got = [0]
        thread = None
        if consumer:
            props = {} if fetch_wait_ms is None else {"fetch.wait.max.ms": fetch_wait_ms}
            c = Consumer(
                {
                    "bootstrap.servers": stack.bootstrap_servers,
                    "group.id": "fx",
                    "auto.offset.reset": "earliest",
                    "session.timeout.ms": 6000,
                    **props,
                }
            )
            c.subscribe(["fx.samples"])

            def read() -> None:
                while not stop.is_set():
                    got[0] += len(c.consume(256, 0.05))
                c.close()

            thread = threading.Thread(target=read, daemon=True)
            thread.start()
            time.sleep(5)  # group join
        p = Producer({"bootstrap.servers": stack.bootstrap_servers, "linger.ms": 5, "enable.idempotence": True})
        pid = stack.broker.pid if stack.broker else None
        t0 = time.monotonic()
        last_t, last_cpu = t0, h.cpu_seconds(pid)
        sent = 0
        while time.monotonic() - t0 < SECONDS:
            delay = t0 + sent / RATE - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            p.produce("fx.samples", VALUE)
            p.poll(0)
            sent += 1
            now = time.monotonic()
            if now - last_t >= 10:
                cpu = h.cpu_seconds(pid)
                rows.append(
                    {
                        "t_s": round(now - t0, 1),
                        "records_held": sent,
                        "broker_cores": round((cpu - last_cpu) / (now - last_t), 3),
                        "consumed": got[0],
                    }
                )
                last_t, last_cpu = now, cpu
        p.flush(30)
        stop.set()
        if thread is not None:
            thread.join(5)
    return rows


def first_acks(idempotent: bool) -> list[float]:
    with LocalStack() as stack:
        ensure_topics(stack.bootstrap_servers, "ax", sample_partitions=1)
        acks: list[float] = []
        p = Producer(
            {"bootstrap.servers": stack.bootstrap_servers, "linger.ms": 5, "enable.idempotence": idempotent, "acks": "all"}
        )
        for _ in range(20):
            sent = time.monotonic()
            p.produce("ax.samples", VALUE, on_delivery=lambda e, m, s=sent: acks.append((time.monotonic() - s) * 1000))
            p.poll(0)
            time.sleep(0.02)
        p.flush(30)
        return [round(a) for a in acks]


def main() -> int:
    load_before = h.load_average()
    cases: dict[str, Any] = {
        "consumer, fetch.wait.max.ms 10 (the trainer's)": fetch_cost(10),
        "consumer, client defaults (fetch.wait.max.ms 500)": fetch_cost(None),
        "no consumer": fetch_cost(None, consumer=False),
    }
    acks = {"idempotent (the services)": first_acks(True), "not idempotent": first_acks(False)}
    load_after = h.load_average()
    rows = ["| case | " + " | ".join(f"{r['records_held']:,} held" for r in cases["no consumer"]) + " |"]
    rows.append("|---|" + "---|" * len(cases["no consumer"]))
    for name, series in cases.items():
        rows.append(f"| {name} | " + " | ".join(f"{r['broker_cores']:.2f}" for r in series) + " |")
    text = [
        "# Embedded broker (Tansu) effects on the service benchmarks",
        "",
        f"Command: `{COMMAND}` — {h.machine()['cpus']} CPUs; a fresh broker per case. Load average (1/5/15 min) "
        f"{load_before} before, {load_after} after.",
        "",
        f"## Broker CPU (cores, per 10-s interval) while a producer writes {RATE:g} records/s of 833 bytes",
        "",
        *rows,
        "",
        "The consumer keeps up in both consumer cases (see `consumed` in the JSON); the cost is per fetch and grows "
        "with the records the broker holds, so the 10-ms wait (≈100 fetches/s) pays it far more often.",
        "",
        "## Delivery latency (ms) of a new producer's first 20 records, sent 20 ms apart",
        "",
        "| producer | acks of records 1 … 20 |",
        "|---|---|",
        *[f"| {name} | {', '.join(str(a) for a in values)} |" for name, values in acks.items()],
        "",
        "(Delivery reports are served every 20 ms here, so 20 ms is the floor of this measurement.)",
        "",
    ]
    payload = {
        "command": COMMAND,
        "machine": h.machine(),
        "load_average_before": load_before,
        "load_average_after": load_after,
        "rate": RATE,
        "fetch_cost": cases,
        "first_acks_ms": acks,
    }
    markdown = "\n".join(text)
    h.write_results("broker_effects", payload, markdown)
    print(markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
