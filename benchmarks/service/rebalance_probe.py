"""Does the embedded broker (Tansu) support cooperative-sticky assignment, and how long does a rebalance
pause the partitions that do not move? Two plain confluent-kafka consumers in one group on a 6-partition
topic fed at ~300 records/s (each record carries its send time): A alone, then B joins, then B leaves
(``close``), joins again as a process of its own, is SIGKILLed (the group expels it after the session
timeout) and comes back.
For each event: the partitions each member owns after it, and the longest send-to-receive delay of the
records on the partitions A owned both before and after (the pause a rebalance costs a partition that stays
put), with the eager default (range) and with cooperative-sticky. Prints one line per (strategy, event);
docs/reliability.md "Replicas" quotes the result.

    .venv/bin/python -m benchmarks.service.rebalance_probe
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import threading
import time
import uuid

from confluent_kafka import Consumer, Producer

from services.kafka.admin import ensure_topics
from services.localstack import LocalStack

PARTITIONS = 6
SESSION_MS = 6000


class Member(threading.Thread):
    """A consumer polling on its own thread; records (partition, sent, received) and its assignment."""

    def __init__(self, conf: dict, topic: str) -> None:
        super().__init__(daemon=True)
        self.consumer = Consumer(conf)
        self.topic = topic
        self.owned: set[int] = set()
        self.seen: list[tuple[int, float, float]] = []
        self.stop_polling = threading.Event()
        self.close_at_end = True
        self.cooperative = "cooperative" in conf.get("partition.assignment.strategy", "")

    def _assign(self, consumer: Consumer, parts: list) -> None:
        if self.cooperative:
            self.owned |= {tp.partition for tp in parts}
            consumer.incremental_assign(parts)
        else:
            self.owned = {tp.partition for tp in parts}
            consumer.assign(parts)

    def _revoke(self, consumer: Consumer, parts: list) -> None:
        self.owned -= {tp.partition for tp in parts}
        if self.cooperative:
            consumer.incremental_unassign(parts)
        else:
            consumer.unassign()

    def run(self) -> None:
        self.consumer.subscribe([self.topic], on_assign=self._assign, on_revoke=self._revoke, on_lost=self._revoke)
        while not self.stop_polling.is_set():
            msg = self.consumer.poll(0.05)
            if msg is not None and msg.error() is None:
                (sent,) = struct.unpack("d", msg.value())
                self.seen.append((msg.partition(), sent, time.time()))
        if self.close_at_end:
            self.consumer.close()


def producer_loop(bootstrap: str, topic: str, stop: threading.Event) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 1})
    i = 0
    while not stop.is_set():
        producer.produce(topic, struct.pack("d", time.time()), partition=i % PARTITIONS)
        producer.poll(0)
        i += 1
        time.sleep(1 / 300)
    producer.flush(10)


def max_delay(member: Member, parts: set[int], since: float, until: float) -> float:
    delays = [r - s for p, s, r in member.seen if p in parts and since <= r <= until]
    return max(delays, default=float("nan"))


def settle(members: list[Member], timeout: float = 30.0) -> float:
    """Wait until each member owns a partition and all are owned exactly once; returns the seconds it took."""
    began = time.time()

    def settled() -> bool:
        owned = [p for m in members for p in m.owned]
        return sorted(owned) == list(range(PARTITIONS)) and all(m.owned for m in members)

    while time.time() - began < timeout:
        if settled():
            time.sleep(0.5)  # ... and stay so
            if settled():
                return time.time() - began - 0.5
        time.sleep(0.05)
    return float("nan")


def settle_count(member: Member, count: int, timeout: float = 30.0) -> float:
    """Wait until ``member`` owns ``count`` partitions; returns the seconds it took."""
    began = time.time()
    while len(member.owned) != count and time.time() - began < timeout:
        time.sleep(0.05)
    return time.time() - began


# A member in a process of its own (what SIGKILL needs): consumes until killed.
CHILD = """
import json, sys
from confluent_kafka import Consumer
c = Consumer(json.loads(sys.argv[1]))
c.subscribe([sys.argv[2]])
while True:
    c.poll(0.1)
"""


def probe(stack: LocalStack, strategy: str) -> None:
    prefix = f"rb{uuid.uuid4().hex[:6]}"
    ensure_topics(stack.bootstrap_servers, prefix, sample_partitions=PARTITIONS)
    topic = f"{prefix}.samples"
    conf = {
        "bootstrap.servers": stack.bootstrap_servers,
        "group.id": f"g-{prefix}",
        "session.timeout.ms": SESSION_MS,
        "heartbeat.interval.ms": SESSION_MS // 3,
        "auto.offset.reset": "latest",
        "partition.assignment.strategy": strategy,
        "fetch.wait.max.ms": 10,
    }
    stop = threading.Event()
    feeder = threading.Thread(target=producer_loop, args=(stack.bootstrap_servers, topic, stop), daemon=True)
    feeder.start()
    a = Member(conf, topic)
    a.start()
    print(f"{strategy}: A alone settled in {settle([a]):.1f} s")
    time.sleep(2)

    def event(name: str, change, members: list[Member]) -> None:
        before = set(a.owned)
        at = time.time()
        change()
        took = settle(members)
        time.sleep(3)
        kept = before & a.owned
        pause = max_delay(a, kept, at, time.time())
        owned = {m_name: sorted(m.owned) for m_name, m in zip("AB", members, strict=False)}
        print(
            f"{strategy}: {name}: all {PARTITIONS} owned again after {took:.1f} s; {owned}; "
            f"A kept {sorted(kept)}: longest delay there {pause:.2f} s"
        )

    b = Member(conf, topic)
    event("B joins", b.start, [a, b])
    event("B leaves (close)", lambda: (b.stop_polling.set(), b.join()), [a])
    child = subprocess.Popen([sys.executable, "-c", CHILD, json.dumps(conf), topic])
    settled_s = settle_count(a, PARTITIONS // 2)
    print(f"{strategy}: B joins again (a process of its own): A owns {sorted(a.owned)} after {settled_s:.1f} s")
    time.sleep(2)
    event("B killed (SIGKILL; expelled after the session)", lambda: (child.kill(), child.wait()), [a])
    b3 = Member(conf, topic)
    event("B back after the kill", b3.start, [a, b3])
    for m in (a, b3):
        m.stop_polling.set()
        m.join()
    stop.set()
    feeder.join()


def main() -> None:
    with LocalStack() as stack:
        for strategy in ("range,roundrobin", "cooperative-sticky"):
            probe(stack, strategy)


if __name__ == "__main__":
    main()
