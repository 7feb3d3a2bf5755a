"""Producer rate: MNIST items (784-byte uint8 tensors, ~833-byte Sample records) into a local Tansu broker
that this script starts (a fresh one per configuration, so the memory-only broker's data is dropped).

Each configuration runs ``--repeats`` times through :class:`services.producer.SampleProducer` (the code
``ferret produce`` runs); the table shows the median. The rate counts records handed to the client
per second from the first record to the end of the final flush, with every delivery report checked
(a failed delivery fails the benchmark). One run is read back by consuming the topic (distinct ids),
never from watermarks. "encode only" times :class:`services.kafka.record_codec.SampleEncoder` without Kafka: the
ceiling the Python side sets. Writes ``results/producer_rate.md``.

    .venv/bin/python -m benchmarks.service.producer_rate [--items 60000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from ferret_core.data import Dataset, load_dataset
from services.config import KafkaSettings, LabelMode, ProducerSettings
from services.config.data_root import default_data_root
from services.kafka import count_distinct
from services.kafka.record_codec import SampleEncoder
from services.localstack import TansuBroker
from services.producer import ProduceReport, SampleProducer

HERE = Path(__file__).resolve().parent
GOAL = 50_000  # items/s
COMMAND = "python -m benchmarks.service.producer_rate"


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    partitions: int = 1
    labels: LabelMode = "with-sample"
    rate: float | None = None
    burst: int = 1
    properties: tuple[tuple[str, str], ...] = ()


CASES = (
    Case("max rate, 1 partition"),
    Case("max rate, 4 partitions", partitions=4),
    Case("max rate, 4 partitions, delayed labels (0 s)", partitions=4, labels="delayed"),
    Case("max rate, 4 partitions, lz4", partitions=4, properties=(("compression.type", "lz4"),)),
    Case("paced at 20,000/s, burst 64, 4 partitions", partitions=4, rate=20_000.0, burst=64),
)


def run_case(dataset: Dataset, case: Case, items: int, repeats: int, verify: bool) -> list[ProduceReport]:
    reports = []
    with tempfile.TemporaryDirectory(prefix="ferret-bench-") as run_dir, TansuBroker(Path(run_dir)) as broker:
        for repeat in range(repeats):
            kafka = KafkaSettings(
                bootstrap_servers=broker.bootstrap_servers,
                topic_prefix=f"bench{repeat}",
                sample_partitions=case.partitions,
                properties=dict(case.properties),
            )
            options = ProducerSettings(
                items=items,
                rate=case.rate,
                burst=case.burst,
                labels=case.labels,
                label_delay_s=0.0,
            )
            report = SampleProducer(dataset, kafka, options).run()
            if not report.ok:
                raise SystemExit(f"{case.name}: {report.failure_reason()}")
            if verify and repeat == 0:
                count = count_distinct(broker.bootstrap_servers, kafka.topics.samples, idle_timeout=2.0)
                if (count.records, count.distinct) != (items, items):
                    raise SystemExit(f"{case.name}: read back {count.records} records, {count.distinct} distinct")
            print(f"  {case.name}: {report.summary()}", file=sys.stderr)
            reports.append(report)
    return reports


def encode_only(dataset: Dataset, items: int) -> float:
    encoder = SampleEncoder("mnist", dataset.input_shape, "uint8")
    x, y, n = dataset.x_train, dataset.y_train, len(dataset.y_train)
    start = time.perf_counter()
    for i in range(items):
        encoder.encode(x[i % n].tobytes(), i, label=int(y[i % n]))
    return items / (time.perf_counter() - start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=60_000, help="items per run (cycles MNIST's 60,000)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--data-root", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "producer_rate.md")
    args = parser.parse_args()

    dataset = load_dataset("mnist", args.data_root or default_data_root())
    load_before = os.getloadavg()[0]
    rows = []
    for index, case in enumerate(CASES):
        reports = run_case(dataset, case, args.items, args.repeats, verify=index == 0)
        rates = [r.rate for r in reports]
        median = statistics.median(rates)
        record_bytes = 833 + (34 if case.labels == "delayed" else 0)
        rows.append(
            f"| {case.name} | {args.items:,} | {median:,.0f} | {min(rates):,.0f} – {max(rates):,.0f} | "
            f"{median * record_bytes / 1e6:.1f} | {sum(r.delivered for r in reports):,} | "
            f"{sum(r.failed for r in reports)} | {'—' if case.rate else f'{median / GOAL:.2f}'} |"
        )
    encoded = encode_only(dataset, args.items)
    rows.append(f"| encode only (no Kafka) | {args.items:,} | {encoded:,.0f} | | | | | {encoded / GOAL:.2f} |")

    machine = f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    load = f"1-minute load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after"
    text = "\n".join(
        [
            "# Producer rate: MNIST into a local Tansu broker",
            "",
            f"Command: `{COMMAND} --items {args.items} --repeats {args.repeats}` ({machine}; the broker runs on the "
            "same machine and shares its cores). Records: 784-byte uint8 tensor, ~833-byte ferret.v1.Sample, "
            "key = sample id; idempotent producer, acks=all, linger.ms=5. Rate = samples per second from the "
            "first record to the end of the final flush, every delivery report checked; the first case was "
            "also read back by consuming the topic (distinct ids = items). Goal: 50,000 items/s at max rate; the "
            "paced case shows the token bucket holding its rate.",
            "",
            f"Other load on the machine: {load} (other processes competing for the cores slow the broker "
            "and the client: compare the ranges).",
            "",
            "| case | items/run | median items/s | range | MB/s (samples) | delivered | failed | median/goal |",
            "|---|---|---|---|---|---|---|---|",
            *rows,
            "",
        ]
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
