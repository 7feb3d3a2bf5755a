"""The demo's live plain consumer: what a user would run instead of Ferret, on the same items, at the same
rate, through the same broker, after Ferret's run.

The replayed plain loop (:mod:`services.demo.baseline`) is an upper bound of that loop: it has no Kafka hop
and no broker or producer beside it on the machine's cores. On a 2-core machine that bound is far above
what either side reaches live (stop 32: Ferret 47.8 %, the replay 65.9 %, where the live side-by-side of
``benchmarks/live/`` has Ferret within 1 point of the live plain consumer at 2×). So the demo also runs the
real thing: :mod:`services.plain_consumer` (poll, predict, publish, one SGD step per item, skip while busy;
the trainer's model, initial weights, torch threads and lr) as a child process reading a topic set of its
own (``<prefix>-plain``), fed by ``ferret produce`` with the same dataset, items, partitions and rate as
Ferret's stream. The phase runs after Ferret's trainer has stopped (unless ``--keep-stack``, where the
trainer idles), so the two never share the CPU.

A failure here is reported (``summary.json`` ``plain_consumer.error``), never the demo's failure: the
baseline is context for the reader.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ferret_core.metrics import LatencyQuantiles
from services.demo.commands import Endpoints, producer_command, producer_env
from services.demo.options import DemoOptions
from services.kafka.admin import ensure_topics
from services.localstack.process import ChildProcess, LocalStackError

PLAIN_LOG = "plain_consumer.log"
PLAIN_PRODUCER_LOG = "plain_producer.log"
READY_TIMEOUT_S = 120.0
SLACK_S = 120.0  # beyond the stream's own length: the consumer's start, the broker, a slow machine

Spawn = Callable[[str, list[str], str, dict[str, str]], ChildProcess]


def plain_prefix(options: DemoOptions) -> str:
    """The plain consumer's topic prefix: apart from Ferret's, so neither reads the other's records."""
    return f"{options.topic_prefix}-plain"


def plain_consumer_command(options: DemoOptions, bootstrap_servers: str, *, python: str = sys.executable) -> list[str]:
    return [
        python,
        "-m",
        "services.plain_consumer",
        "--dataset",
        options.dataset,
        "--model",
        options.model,
        "--bootstrap",
        bootstrap_servers,
        "--prefix",
        plain_prefix(options),
        "--items",
        str(options.items),
        "--timeout-s",
        f"{options.items / options.rate + SLACK_S:.0f}",
        "--timeline",
    ]


@dataclass(frozen=True)
class PlainConsumerResult:
    """The live plain consumer's run: its JSON line's counts, and the running online accuracy (percent)
    at ``seconds`` after its first labelled prediction. ``error``: why it has no result (the rest empty)."""

    items: int = 0
    labelled: int = 0
    trained: int = 0
    correct: int = 0
    latency_ms_p50: float | None = None
    latency_ms_p99: float | None = None
    cpu_s: float | None = None
    seconds: tuple[float, ...] = ()
    running: tuple[float, ...] = ()
    error: str | None = None

    @property
    def accuracy(self) -> float | None:
        return 100.0 * self.correct / self.labelled if self.labelled else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "online_accuracy": self.accuracy,
            "items": self.items,
            "labelled": self.labelled,
            "trained": self.trained,
            "latency_ms_p50": self.latency_ms_p50,
            "latency_ms_p99": self.latency_ms_p99,
            "cpu_s": self.cpu_s,
            "error": self.error,
            "how": "live: the plain consumer (services/plain_consumer) on the same items and rate, its own topics, "
            "after Ferret's run",
        }


def parse_result(log_text: str) -> PlainConsumerResult:
    """The consumer's JSON line (its last line that parses as a JSON object) as a result."""
    for line in reversed(log_text.splitlines()):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            data = json.loads(line)
        except ValueError:
            continue
        return from_json(data)
    return PlainConsumerResult(error="the plain consumer printed no result line")


def from_json(data: dict[str, Any]) -> PlainConsumerResult:
    latencies = [max(0.0, float(v)) for v in data.get("latencies_ms", [])]
    quantiles: dict[str, float] = {}
    if latencies:
        latency = LatencyQuantiles(quantiles=(0.5, 0.99), window=len(latencies))
        latency.update_many(latencies)
        quantiles = latency.get()
    timeline: Sequence[Sequence[int]] = data.get("timeline", [])
    seconds: list[float] = []
    running: list[float] = []
    correct = 0
    for n, (published_ms, hit) in enumerate(timeline, start=1):
        correct += int(hit)
        seconds.append((published_ms - timeline[0][0]) / 1000)
        running.append(100.0 * correct / n)
    return PlainConsumerResult(
        items=int(data["items"]),
        labelled=int(data["labelled"]),
        trained=int(data["trained"]),
        correct=int(data["correct"]),
        latency_ms_p50=quantiles.get("p50"),
        latency_ms_p99=quantiles.get("p99"),
        cpu_s=float(data["cpu_s"]),
        seconds=tuple(seconds),
        running=tuple(running),
    )


def run_plain_phase(
    options: DemoOptions, endpoints: Endpoints, spawn: Spawn, out_dir: Path, *, python: str = sys.executable
) -> PlainConsumerResult:
    """Create the plain topics, start the consumer, wait for its READY, stream the same items at the same rate
    into its topics, and wait for its result line."""
    prefix = plain_prefix(options)
    ensure_topics(endpoints.bootstrap_servers, prefix, sample_partitions=options.partitions)
    consumer = spawn("plain-consumer", plain_consumer_command(options, endpoints.bootstrap_servers, python=python),
                     PLAIN_LOG, {})  # fmt: skip
    log_path = out_dir / PLAIN_LOG
    try:
        consumer.wait_ready(lambda: "READY" in log_path.read_text(errors="replace"), timeout=READY_TIMEOUT_S)
    except LocalStackError as exc:
        consumer.stop(timeout=5)
        return PlainConsumerResult(error=f"the plain consumer did not start: {exc}")
    producer = spawn("plain-producer", producer_command(replace(options, topic_prefix=prefix), endpoints),
                     PLAIN_PRODUCER_LOG, producer_env())  # fmt: skip
    allowed = options.items / options.rate + SLACK_S
    deadline = time.monotonic() + allowed
    while consumer.running and time.monotonic() < deadline:
        time.sleep(0.2)
    if consumer.running:
        consumer.stop(timeout=5)
        producer.stop(timeout=5)
        return PlainConsumerResult(error=f"the plain consumer had no result within {allowed:.0f} s")
    producer.stop(timeout=30)
    if consumer.returncode != 0:
        return PlainConsumerResult(error=f"the plain consumer exited with status {consumer.returncode}")
    return parse_result(log_path.read_text(errors="replace"))
