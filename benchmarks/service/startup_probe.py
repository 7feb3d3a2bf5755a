"""After assignment, how long until a consumer with the trainer's settings receives the first records of a
stream that a fresh idempotent producer starts at that moment (84 records/s)? Variants: assign as the
trainer does; with the start offsets resolved in on_assign (committed, else the low watermark: no second
OffsetFetch by the client); with fetch.error.backoff.ms 10; and (``wait_id``, issue 7i) with the producer
waiting for its producer id before the stream starts (``services.producer.ready``, what ``ferret produce``
does since issue 7i). Prints one line per case: ms from produce to
receive for the first 5 records, records 40–42 (~0.5 s in) and the last 3 (issue 7g's start-up
diagnosis; results/startup_probe.md).

    .venv/bin/python -m benchmarks.service.startup_probe
"""

import threading
import time
import uuid

from confluent_kafka import Consumer, Producer, TopicPartition

from services.kafka.admin import ensure_topics
from services.localstack import LocalStack
from services.producer.ready import ProducerReadiness


def run(stack, extra, explicit=False, wait_id=False):
    prefix = f"jp{uuid.uuid4().hex[:4]}"
    ensure_topics(stack.bootstrap_servers, prefix, sample_partitions=1)
    topic = f"{prefix}.samples"
    conf = {
        "bootstrap.servers": stack.bootstrap_servers,
        "group.id": f"g-{prefix}",
        "session.timeout.ms": 6000,
        "heartbeat.interval.ms": 2000,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "group.instance.id": "r0",
        "fetch.wait.max.ms": 10,
        **extra,
    }
    c = Consumer(conf)
    assigned = {}

    def on_assign(cons, parts):
        if explicit:  # resolve where to start here: committed, else the low watermark
            committed = cons.committed(parts, timeout=5)
            parts = [
                TopicPartition(
                    tp.topic,
                    tp.partition,
                    tp.offset if tp.offset >= 0 else cons.get_watermark_offsets(tp, timeout=5)[0],
                )
                for tp in committed
            ]
        cons.assign(parts)
        assigned["t"] = time.monotonic()

    c.subscribe([topic], on_assign=on_assign)
    while "t" not in assigned:
        c.consume(256, 0.05)
    config = {"bootstrap.servers": stack.bootstrap_servers, "linger.ms": 5, "enable.idempotence": True, "acks": "all"}
    readiness = ProducerReadiness(config)
    if wait_id:
        config = {**config, **readiness.client_config(), "error_cb": readiness.note_error}
    p = Producer(config)
    p.list_topics(timeout=5)
    if wait_id:
        readiness.wait(p, topic)
    sent = {}

    def produce():
        for i in range(84):
            sent[i] = time.monotonic()
            p.produce(topic, value=str(i).encode())
            p.poll(0)
            time.sleep(1 / 84)
        p.flush(5)

    t0 = time.monotonic()
    th = threading.Thread(target=produce)
    th.start()
    got = {}
    while len(got) < 84 and time.monotonic() - t0 < 10:
        for m in c.consume(256, 0.05):
            if m.error() is None:
                got[int(m.value())] = time.monotonic()
    th.join()
    lat = [round((got[i] - sent[i]) * 1000) for i in sorted(got)]
    c.close()
    return {
        "explicit": explicit,
        "wait_id": wait_id,
        "extra": extra,
        "assign_to_stream_ms": round((t0 - assigned["t"]) * 1000),
        "first": lat[:5],
        "at_0.5s": lat[40:43],
        "last": lat[-3:],
    }


with LocalStack() as stack:
    cases = [({}, False, False), ({}, True, False), ({}, False, False), ({}, True, False)]
    cases += [({"fetch.error.backoff.ms": 10}, False, False), ({}, False, True), ({}, False, True)]
    for extra, explicit, wait_id in cases:
        print(run(stack, extra, explicit, wait_id), flush=True)
