"""The local broker's CPU while a trainer is idle (issue 7: "an idle local broker used ~40 % of a core while
a trainer polled it"): ``ferret run`` on a fresh local stack (Tansu + Valkey), a stream of ``--items``
MNIST items (the demo's 3000 by default) produced and predicted first (Tansu's fetch cost grows with the
records it holds), then nothing for ``--idle-s`` seconds, over which the broker's and the trainer's CPU
are read from ``/proc/<pid>/stat`` (cores: 1.0 = one core busy). Cases: the trainer's consumer as
committed, and with ``kafka.properties`` overrides of ``fetch.wait.max.ms``; plus the broker alone
holding the same records with no client at all (the floor).

    .venv/bin/python -m benchmarks.service.broker_idle                  # → results/broker_idle.{md,json}
    .venv/bin/python -m benchmarks.service.broker_idle --tag after --cases shipped
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from benchmarks.service import harness as h
from services.config import ProducerSettings, load_settings
from services.kafka.admin import ensure_topics
from services.localstack import LocalStack
from services.producer.stream import SampleProducer

COMMAND = "python -m benchmarks.service.broker_idle"
CASES: dict[str, dict[str, Any] | None] = {
    "no client (broker alone)": None,
    "shipped": {},
    "fetch.wait.max.ms 100": {"fetch.wait.max.ms": 100},
    "fetch.wait.max.ms 500": {"fetch.wait.max.ms": 500},
}


def idle_cpu(pids: dict[str, int | None], seconds: float) -> dict[str, float]:
    t0 = time.monotonic()
    before = {name: h.cpu_seconds(pid) for name, pid in pids.items()}
    time.sleep(seconds)
    took = time.monotonic() - t0
    return {name: round((h.cpu_seconds(pid) - before[name]) / took, 4) for name, pid in pids.items()}


def with_trainer(props: dict[str, Any], dataset: Any, items: int, rate: float, idle_s: float) -> dict[str, Any]:
    with h.running_service("mnistnet", kafka_properties=props) as (service, reader, _sampler):
        report = service.producer(dataset, rate, items, "idle").run()
        complete = reader.wait_for("idle", report.produced, 120)
        reader.close()  # the benchmark's own reader must not fetch during the idle window
        time.sleep(2.0)
        cpu = idle_cpu({"broker": service.pids["broker"], "trainer": service.pids["trainer"]}, idle_s)
    return {"produced": report.produced, "predicted": complete, "idle_cpu": cpu}


def broker_alone(dataset: Any, items: int, rate: float, idle_s: float) -> dict[str, Any]:
    with LocalStack() as stack:
        settings = load_settings(
            None, env={"FERRET_KAFKA_BOOTSTRAP_SERVERS": stack.bootstrap_servers, "FERRET_KAFKA_TOPIC_PREFIX": "idle"}
        )
        ensure_topics(stack.bootstrap_servers, "idle", sample_partitions=1)
        options = ProducerSettings(rate=rate, items=items, stream="idle")
        report = SampleProducer(dataset, settings.kafka, options, create_topics=False).run()
        time.sleep(2.0)
        pid = stack.broker.pid if stack.broker else None
        cpu = idle_cpu({"broker": pid}, idle_s)
    return {"produced": report.produced, "predicted": None, "idle_cpu": cpu}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=3000)
    parser.add_argument("--rate", type=float, default=150.0)
    parser.add_argument("--idle-s", type=float, default=15.0)
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--tag", default="")
    args = parser.parse_args()
    dataset = h.mnist()
    load_before = h.load_average()
    rows: list[dict[str, Any]] = []
    for case in args.cases:
        print(f"  {case} …", file=sys.stderr, flush=True)
        props = CASES[case]
        run = (
            broker_alone(dataset, args.items, args.rate, args.idle_s)
            if props is None
            else with_trainer(props, dataset, args.items, args.rate, args.idle_s)
        )
        rows.append({"case": case, "kafka_properties": props, **run})
    load_after = h.load_average()
    command = COMMAND + (f" --items {args.items}" if args.items != 3000 else "")
    command += f" --idle-s {args.idle_s:g}" if args.idle_s != 15.0 else ""
    command += f" --cases {' '.join(repr(c) for c in args.cases)}" if args.cases != list(CASES) else ""
    command += f" --tag {args.tag}" if args.tag else ""
    name = "broker_idle" + (f"-{args.tag}" if args.tag else "")
    result = {"command": command, "load_average": {"before": load_before, "after": load_after}, "rows": rows}
    (h.RESULTS / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
    md = [
        f"# Broker CPU while the trainer is idle ({args.tag or 'run'})",
        "",
        f"Command: `{command}` — {args.items} MNIST items at {args.rate:g}/s produced and predicted first, then "
        f"{args.idle_s:g} s with no records; CPU from /proc/<pid>/stat in cores. Load average before "
        f"{load_before}, after {load_after}.",
        "",
        "| case | kafka.properties | items held | predicted | broker CPU idle (cores) | trainer CPU idle (cores) |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        cpu = r["idle_cpu"]
        trainer = cpu.get("trainer")
        md.append(
            f"| {r['case']} | {r['kafka_properties'] if r['kafka_properties'] is not None else '—'} | "
            f"{r['produced']:,} | {r['predicted'] if r['predicted'] is not None else '—'} | {cpu['broker']:.3f} | "
            f"{'—' if trainer is None else f'{trainer:.3f}'} |"
        )
    (h.RESULTS / f"{name}.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
