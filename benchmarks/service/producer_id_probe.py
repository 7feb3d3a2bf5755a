"""A fresh idempotent producer (the services' settings, plus librdkafka statistics every 10 ms to read its
producer-id state): when it gets its producer id, and the delivery latency of its first 20 records sent
20 ms apart, with and without waiting for the id first. Prints one line per case (issue 7g's start-up
diagnosis; results/startup_probe.md).

    .venv/bin/python -m benchmarks.service.producer_id_probe
"""

import json
import time

from confluent_kafka import Producer

from services.kafka.admin import ensure_topics
from services.localstack import LocalStack


def run(stack, wait_pid):
    state = {"idemp": None, "t": None}
    t0 = time.monotonic()

    def stats(s):
        d = json.loads(s)
        st = d.get("eos", {}).get("idemp_state")
        if st == "Assigned" and state["t"] is None:
            state["t"] = time.monotonic() - t0
        state["idemp"] = st

    conf = {
        "bootstrap.servers": stack.bootstrap_servers,
        "linger.ms": 5,
        "enable.idempotence": True,
        "acks": "all",
        "statistics.interval.ms": 10,
        "stats_cb": stats,
    }
    p = Producer(conf)
    p.list_topics(timeout=5)
    if wait_pid:
        while state["t"] is None and time.monotonic() - t0 < 5:
            p.poll(0.005)
    started = time.monotonic() - t0
    acks = []
    for _i in range(20):
        sent = time.monotonic()
        p.produce(
            "px.samples",
            value=b"x" * 800,
            on_delivery=lambda err, msg, sent=sent: acks.append(round((time.monotonic() - sent) * 1000)),
        )
        end = sent + 0.02
        while time.monotonic() < end:
            p.poll(0.002)
    p.flush(5)
    return {
        "wait_pid": wait_pid,
        "pid_assigned_after_s": state["t"],
        "stream_started_after_s": round(started, 3),
        "acks_ms": acks,
    }


with LocalStack() as stack:
    ensure_topics(stack.bootstrap_servers, "px", sample_partitions=1)
    for w in (False, True, False, True):
        print(run(stack, w), flush=True)
