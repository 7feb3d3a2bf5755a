"""Where a fresh stream's first records wait (issue 7i): per record, ``produce()``, the delivery report
(ack) and a consumer's receipt, for a new producer starting 84 records/s (MNISTNet's half-saturation rate)
on the embedded broker, varying one thing at a time.

Each case runs ``--repeats`` times on one embedded Tansu broker, with a fresh topic and fresh clients per
repeat: a consumer with the trainer's settings (``CONSUMER_DEFAULTS`` + ``KafkaSettings.consumer_config``:
``fetch.wait.max.ms`` 10, reading as the trainer's loop does: what is there, else ``consume(1, 0.05)``) is
assigned the topic's one partition from its beginning (``assign()``: a group join takes ~6 s on Tansu and is
not what is measured here) and has had its first fetch answered before the producer is made, as the
trainer's consumer has seconds after its join (unless the case says otherwise); then a new producer (the services' settings: idempotent, acks=all, linger 5 ms) sends
``--seconds`` × 84 records of 800 bytes. Times are on the monotonic clock; *ready* = client made → first
``produce()``. Per case: the median over repeats of the first record's produce → ack, ack → receipt and
produce → receipt, and of produce → receipt over the records produced in the stream's first second
(p50 / p99 / max) and in its second second (p99); the first record's range over repeats.

Then, once: librdkafka's ``eos`` debug log of a producer made as ``main`` makes it, and of one that waits
(the producer-id mechanism, lines relative to the client's creation), and the CPU cost of the statistics
the wait reads (an idle producer's process CPU over 4 s, with and without them). The case
``ferret produce`` is :class:`services.producer.stream.SampleProducer` as this checkout has it (``--rate 84``),
latency = receipt − the sample's event time (wall clock).

    .venv/bin/python -m benchmarks.service.first_records          # → results/first_records.{md,json}
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from benchmarks.service import harness as h
from ferret_core.data import Dataset
from services.config import KafkaSettings, ProducerSettings
from services.kafka.admin import ensure_topics
from services.localstack import LocalStack
from services.producer.ready import ProducerReadiness
from services.producer.stream import SampleProducer
from services.proto_gen.ferret.v1.messages_pb2 import Sample
from services.trainer.stream import CONSUMER_DEFAULTS

COMMAND = "python -m benchmarks.service.first_records"
RATE = 84.0
VALUE_BYTES = 800


@dataclass(frozen=True)
class Case:
    name: str
    what: str
    warm: str = "list_topics"  # none | list_topics | wait_id
    idempotent: bool = True
    consumer: dict[str, Any] = field(default_factory=dict)
    # when the consumer starts: "fetching" (assigned, and its first fetch answered: the trainer's state once
    # its group join is done), "assigned" (assign() just before the stream), "group" (subscribe() as the
    # trainer, the stream starting at on_assign as latency.py starts it at SERVING), "after_ack"
    consumer_start: str = "fetching"
    sample_producer: bool = False


CASES = [
    Case("main", "as `ferret produce --rate` at main: `list_topics`, then the stream at once"),
    Case("no metadata request", "as `ferret produce` without `--rate` at main: the stream at once", warm="none"),
    Case("not idempotent", "`main`, `enable.idempotence` false (no producer id to wait for)", idempotent=False),
    Case("wait for the producer id", "`ProducerReadiness.wait`: metadata until librdkafka reports the id", "wait_id"),
    Case(
        "… consumer fetch.wait.max.ms 500",
        "`wait for the producer id`, the consumer with librdkafka's default fetch wait",
        "wait_id",
        consumer={"fetch.wait.max.ms": 500},
    ),
    Case(
        "… consumer fetch.min.bytes 100000",
        "`wait for the producer id`, the consumer asking for ≥ 100 kB per fetch (≤ its 10-ms wait)",
        "wait_id",
        consumer={"fetch.min.bytes": 100000},
    ),
    Case(
        "… consumer joins the group",
        "`wait for the producer id`, the consumer subscribes as the trainer does; the stream starts at its "
        "`on_assign` (as `latency.py` starts it when the trainer reports SERVING)",
        "wait_id",
        consumer_start="group",
    ),
    Case(
        "… consumer assigned, not yet fetching",
        "`wait for the producer id`, the consumer made and assigned (`assign()`) just before the stream",
        "wait_id",
        consumer_start="assigned",
    ),
    Case(
        "… consumer assigned after the first ack",
        "`wait for the producer id`, the consumer made and assigned once the first record is acked",
        "wait_id",
        consumer_start="after_ack",
    ),
    Case(
        "ferret produce (this checkout)", "`SampleProducer` at 84/s; latency from the event time", sample_producer=True
    ),
]


class Reader:
    """A consumer with the trainer's settings on its own thread; receipt times by record index."""

    def __init__(self, kafka: KafkaSettings, extra: dict[str, Any], *, event_times: bool, start: str) -> None:
        config = {**CONSUMER_DEFAULTS, **kafka.consumer_config(), **extra}
        self.consumer = Consumer(config)
        self.event_times = event_times
        self.got: dict[int, float] = {}  # index -> monotonic receipt (or wall-clock ms − event ms)
        self.ready = threading.Event()  # as ``start`` says: assigned, or fetching
        self.fetching = threading.Event()  # a fetch was answered (end of partition, or a record)
        self.stop = threading.Event()
        if start == "group":
            self.consumer.subscribe([kafka.topics.samples], on_assign=self._on_assign)
        else:
            self.consumer.assign([TopicPartition(kafka.topics.samples, 0, OFFSET_BEGINNING)])
            if start != "fetching":
                self.ready.set()
        self.start = start
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        c = self.consumer
        try:
            while not self.stop.is_set():
                batch = c.consume(256, 0) or c.consume(1, 0.05)
                now, wall = time.monotonic(), time.time() * 1000
                for m in batch:
                    self.fetching.set()
                    if self.start == "fetching":
                        self.ready.set()
                    if m.error() is not None:
                        continue
                    if self.event_times:
                        sample = Sample.FromString(m.value())
                        self.got[sample.sequence] = wall - sample.event_time_ms
                    else:
                        self.got[int(m.value()[:8])] = now
        finally:
            c.close()

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        consumer.assign(partitions)
        self.ready.set()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)


def _fresh_topics(stack: LocalStack, tag: str) -> KafkaSettings:
    """Kafka settings for a fresh one-partition sample topic (created) with its own group."""
    prefix = f"{tag}{uuid.uuid4().hex[:6]}"
    ensure_topics(stack.bootstrap_servers, prefix, sample_partitions=1)
    return KafkaSettings(
        bootstrap_servers=stack.bootstrap_servers,
        topic_prefix=prefix,
        sample_partitions=1,
        group_id=f"g-{prefix}",
        instance_id="probe",
    )


def _raw_run(stack: LocalStack, case: Case, seconds: float) -> dict[str, Any]:
    kafka = _fresh_topics(stack, "fr")
    topic = kafka.topics.samples
    reader = None
    if case.consumer_start != "after_ack":
        reader = Reader(kafka, case.consumer, event_times=False, start=case.consumer_start)
        reader.ready.wait(30)
    config = {"bootstrap.servers": stack.bootstrap_servers, "linger.ms": 5, "acks": "all"}
    config["enable.idempotence"] = case.idempotent
    readiness = ProducerReadiness(config)
    if case.warm == "wait_id":
        config = {**config, **readiness.client_config(), "error_cb": readiness.note_error}
    made = time.monotonic()
    p = Producer(config)
    waited = None
    if case.warm == "list_topics":
        p.list_topics(timeout=10)
    elif case.warm == "wait_id":
        waited = readiness.wait(p, topic)
    sent: dict[int, float] = {}
    acks: dict[int, float] = {}
    n = round(RATE * seconds)
    start = time.monotonic()
    for i in range(n):
        due = start + i / RATE
        while (now := time.monotonic()) < due:
            p.poll(min(0.002, due - now))
        sent[i] = time.monotonic()
        p.produce(
            topic,
            value=f"{i:08d}".encode() + b"x" * (VALUE_BYTES - 8),
            on_delivery=lambda err, m: acks.setdefault(int(m.value()[:8]), time.monotonic()),
        )
        p.poll(0)
        if reader is None and 0 in acks:
            reader = Reader(kafka, case.consumer, event_times=False, start="assigned")
    p.flush(10)
    if reader is None:
        reader = Reader(kafka, case.consumer, event_times=False, start="assigned")
    deadline = time.monotonic() + 15
    while len(reader.got) < n and time.monotonic() < deadline:
        time.sleep(0.02)
    reader.close()
    got = reader.got
    ms = lambda a, b: round((a - b) * 1000, 1)  # noqa: E731
    first_second = [ms(got[i], sent[i]) for i in sent if i in got and sent[i] < start + 1]
    second_second = [ms(got[i], sent[i]) for i in sent if i in got and start + 1 <= sent[i] < start + 2]
    return {
        "ready_ms": ms(start, made),
        "wait": None if waited is None else waited.__dict__,
        "produced": n,
        "acked": len(acks),
        "received": len(got),
        "first_ack_ms": ms(acks[0], sent[0]) if 0 in acks else None,
        "first_ack_to_receipt_ms": ms(got[0], acks[0]) if 0 in got and 0 in acks else None,
        "first_receipt_ms": ms(got[0], sent[0]) if 0 in got else None,
        "first_s": h.summary(first_second, "_ms"),
        "second_s_p99_ms": h.quantile(second_second, 0.99),
        "first_10_receipt_ms": [ms(got[i], sent[i]) for i in range(10) if i in got],
    }


def _sample_producer_run(stack: LocalStack, dataset: Dataset, seconds: float) -> dict[str, Any]:
    kafka = _fresh_topics(stack, "fs")
    reader = Reader(kafka, {}, event_times=True, start="fetching")
    reader.ready.wait(30)
    n = round(RATE * seconds)
    made = time.monotonic()
    report = SampleProducer(
        dataset, kafka, ProducerSettings(rate=RATE, items=n, stream="first"), create_topics=False
    ).run()
    deadline = time.monotonic() + 15
    while len(reader.got) < n and time.monotonic() < deadline:
        time.sleep(0.02)
    reader.close()
    lat = reader.got  # by sequence: receipt − event time (ms, wall clock)
    per_s = RATE
    first_second = [v for i, v in lat.items() if i < per_s]
    second_second = [v for i, v in lat.items() if per_s <= i < 2 * per_s]
    return {
        "ready_ms": getattr(report, "ready_s", None) and round(report.ready_s * 1000, 1),
        "run_s": round(time.monotonic() - made, 2),
        "produced": report.produced,
        "acked": report.delivered,
        "received": len(lat),
        "first_ack_ms": None,
        "first_ack_to_receipt_ms": None,
        "first_receipt_ms": round(lat[0], 1) if 0 in lat else None,
        "first_s": h.summary(first_second, "_ms"),
        "second_s_p99_ms": h.quantile(second_second, 0.99),
        "first_10_receipt_ms": [round(lat[i], 1) for i in range(10) if i in lat],
    }


_EOS_FACILITIES = ("IDEMPSTATE", "PIDBROKER", "TXN", "GETPID", "DESTROY", "STATE")


def eos_log(stack: LocalStack, wait: bool) -> list[str]:
    """librdkafka's eos/broker debug lines of one new producer (stderr captured), ms from its creation."""
    prefix = f"fe{uuid.uuid4().hex[:6]}"
    ensure_topics(stack.bootstrap_servers, prefix, sample_partitions=1)
    topic = f"{prefix}.samples"
    config: dict[str, Any] = {
        "bootstrap.servers": stack.bootstrap_servers,
        "linger.ms": 5,
        "acks": "all",
        "enable.idempotence": True,
        "debug": "eos,broker",
    }
    readiness = ProducerReadiness(config)
    if wait:
        config = {**config, **readiness.client_config(), "error_cb": readiness.note_error}
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as log:
        os.dup2(log.fileno(), 2)
        try:
            made = time.time()
            p = Producer(config)
            if wait:
                readiness.wait(p, topic)
            else:
                p.list_topics(timeout=10)
            t_first = time.time()
            acked = []
            p.produce(topic, b"x", on_delivery=lambda err, m: acked.append(time.time()))
            p.flush(10)
            del p
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
        log.seek(0)
        text = log.read().decode(errors="replace")
    lines = []
    for line in text.splitlines():
        m = re.match(r"%\d\|(\d+\.\d+)\|(\w+)\|[^|]*\| \[thrd:([^\]]*)\]: (.*)", line)
        if not m or m.group(2) not in _EOS_FACILITIES:
            continue
        if m.group(2) == "STATE" and "-> UP" not in m.group(4) and "UP ->" not in m.group(4):
            continue
        if m.group(2) == "DESTROY" and "bootstrap" not in m.group(4):
            continue
        if float(m.group(1)) > t_first + 5:
            break
        lines.append(f"{(float(m.group(1)) - made) * 1000:7.0f} ms  {m.group(2):<10} {m.group(4)[:150]}")
    lines.append(f"{(t_first - made) * 1000:7.0f} ms  (first produce())")
    if acked:
        lines.append(f"{(acked[0] - made) * 1000:7.0f} ms  (its delivery report)")
    return lines


def stats_cost(stack: LocalStack, seconds: float = 4.0) -> dict[str, float]:
    """Process CPU seconds per second of an idle producer served every 10 ms, with and without statistics."""
    out = {}
    for name, extra in (("without statistics", {}), ("statistics every 50 ms", {"statistics.interval.ms": 50})):
        readiness = ProducerReadiness({"enable.idempotence": True, **extra})
        config = {"bootstrap.servers": stack.bootstrap_servers, "enable.idempotence": True, **extra}
        if extra:
            config.update(readiness.client_config())
        p = Producer(config)
        p.list_topics(timeout=10)
        cpu, began = time.process_time(), time.monotonic()
        while time.monotonic() - began < seconds:
            p.poll(0.01)
        out[name] = round((time.process_time() - cpu) / (time.monotonic() - began), 4)
        p.flush(5)
    return out


def _median(values: list[float | None]) -> float:
    xs = [v for v in values if v is not None]
    return statistics.median(xs) if xs else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--cases", nargs="+", default=None, help="case names (default: all)")
    args = parser.parse_args()
    cases = [c for c in CASES if args.cases is None or c.name in args.cases]
    load_before = h.load_average()
    dataset = h.mnist() if any(c.sample_producer for c in cases) else None
    results: dict[str, list[dict[str, Any]]] = {}
    with LocalStack() as stack:
        for repeat in range(args.repeats):  # cases interleaved, so drift over the run hits them alike
            for case in cases:
                print(f"  {case.name} #{repeat + 1}", file=sys.stderr, flush=True)
                run = (
                    _sample_producer_run(stack, dataset, args.seconds)
                    if case.sample_producer
                    else _raw_run(stack, case, args.seconds)
                )
                results.setdefault(case.name, []).append(run)
        logs = {"main": eos_log(stack, wait=False), "wait for the producer id": eos_log(stack, wait=True)}
        cost = stats_cost(stack)
    load_after = h.load_average()

    command = COMMAND + (f" --repeats {args.repeats}" if args.repeats != 3 else "")
    command += f" --seconds {args.seconds:g}" if args.seconds != 2.0 else ""
    rows = [
        "| case | ready ms | 1st record: produce → ack | ack → receipt | produce → receipt (range) | first second "
        "p50 / p99 / max | second second p99 |",
        "|---|---|---|---|---|---|---|",
    ]
    for case in cases:
        runs = results[case.name]
        firsts = [r["first_receipt_ms"] for r in runs if r["first_receipt_ms"] is not None]
        rows.append(
            f"| {case.name} | {h.fmt(_median([r['ready_ms'] for r in runs]), 0)} | "
            f"{h.fmt(_median([r['first_ack_ms'] for r in runs]))} | "
            f"{h.fmt(_median([r['first_ack_to_receipt_ms'] for r in runs]))} | "
            f"{h.fmt(_median(firsts))} ({h.fmt(min(firsts, default=float('nan')), 0)}–"
            f"{h.fmt(max(firsts, default=float('nan')), 0)}) | "
            f"{h.fmt(_median([r['first_s']['p50_ms'] for r in runs]))} / "
            f"{h.fmt(_median([r['first_s']['p99_ms'] for r in runs]))} / "
            f"{h.fmt(_median([r['first_s']['max_ms'] for r in runs]))} | "
            f"{h.fmt(_median([r['second_s_p99_ms'] for r in runs]))} |"
        )
    text = [
        "# A fresh stream's first records: produce → ack → receipt (issue 7i)",
        "",
        f"Command: `{command}` — {h.machine()['cpus']} CPUs; embedded Tansu; librdkafka "
        f"{__import__('confluent_kafka').libversion()[0]}; {args.repeats} repeats per case (interleaved), "
        f"{round(RATE * args.seconds)} records at {RATE:g}/s each; git {h.git_head()}. Load average (1/5/15 min) "
        f"{load_before} before, {load_after} after.",
        "",
        "Medians over the repeats (ms, monotonic clock). *ready*: client made → first `produce()`. The cases:",
        "",
        *[f"- **{c.name}**: {c.what}." for c in cases],
        "",
        *rows,
        "",
        "## librdkafka's producer-id steps (debug `eos,broker`, one producer each, ms from its creation)",
        "",
        *[part for name, lines in logs.items() for part in (f"{name}:", "", "```", *lines, "```", "")],
        "## The statistics the wait reads: an idle producer's process CPU (cores)",
        "",
        *[f"- {name}: {value}" for name, value in cost.items()],
        "",
    ]
    payload = {
        "command": command,
        "git_head": h.git_head(),
        "machine": h.machine(),
        "load_average_before": load_before,
        "load_average_after": load_after,
        "rate": RATE,
        "cases": {c.name: {"what": c.what, "runs": results[c.name]} for c in cases},
        "eos_logs": logs,
        "statistics_cpu_cores": cost,
    }
    markdown = "\n".join(text)
    h.write_results("first_records", payload, markdown)
    print(markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
