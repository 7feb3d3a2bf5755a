"""kill -9 recovery of the trainer: from the kill to the next prediction (issue 12; goal ≤ 5 s).

Each run: a fresh prefix on an embedded stack (Tansu + Valkey), 600 digits samples on 2 partitions, then
``ferret run`` with ``FERRET_FAILPOINT=trainer.mid-record:kill@150`` (SIGKILL after training its 150th
item, before publishing its outcome). When it is dead a new ``ferret run`` starts at once with the same
group. Measured from the kill (the first process reaped): *up* (the control port answers a health check),
*ready* (readiness SERVING: the group assigned its partitions), *first prediction* (the earliest
``predicted_time_ms`` after the kill on ``<prefix>.predictions``, read by a fresh group). Every outcome is
counted from the topics (items in, outcomes out, re-emissions flagged / unflagged).

Baseline, same run: a plain ``confluent_kafka`` consumer process (no torch, no model) killed -9 and
restarted in the same kind of group (2 s session): kill → its first record. The ratio says how much of
the trainer's recovery is the process and model start-up rather than the group join.

    /work/tools/timed .venv/bin/python -m benchmarks.reliability.kill_recovery --runs 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.kafka.admin import TopicNames, ensure_topics
from services.localstack.stack import LocalStack
from tests.integration.trainer_support import produce_digits
from tests.reliability.support import TrainerCommand, read_outcomes, trainer_env

RESULTS = Path(__file__).parent / "results"
ITEMS = 600

PLAIN_CONSUMER = """
import sys, time
from confluent_kafka import Consumer
c = Consumer({"bootstrap.servers": sys.argv[1], "group.id": sys.argv[2], "session.timeout.ms": 2000,
              "heartbeat.interval.ms": 666, "auto.offset.reset": "earliest", "enable.auto.commit": False})
c.subscribe([sys.argv[3]])
while True:
    m = c.poll(0.05)
    if m is not None and m.error() is None:
        print(time.time(), flush=True)
        if sys.argv[4] == "kill":
            time.sleep(30)  # killed -9 here
        break
c.close()
"""


def health(target: str) -> int | None:
    try:
        with grpc.insecure_channel(target) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=0.5)
        return int(reply.status)
    except grpc.RpcError:
        return None


def trainer_run(stack: LocalStack, workdir: Path, index: int) -> dict[str, float | int]:
    prefix = f"kill{index}{int(time.time())}"
    ensure_topics(stack.bootstrap_servers, prefix, sample_partitions=2)
    produce_digits(stack.bootstrap_servers, TopicNames(prefix).samples, ITEMS)
    env = trainer_env(stack.bootstrap_servers, stack.redis_url, prefix)
    log = workdir / f"{prefix}.log"
    first = TrainerCommand({**env, "FERRET_FAILPOINT": "trainer.mid-record:kill@150"}, log)
    assert first.wait_exit(180) == -9, log.read_text()[-2000:]
    killed = time.time()
    second = TrainerCommand(env, log)
    up = ready = None
    while ready is None and time.time() - killed < 120:
        status = health(env["FERRET_CONTROL_LISTEN"])
        if status is not None and up is None:
            up = time.time()
        if status == health_pb2.HealthCheckResponse.SERVING:
            ready = time.time()
        time.sleep(0.02)
    outcomes = read_outcomes(stack.bootstrap_servers, prefix, expected=ITEMS, timeout_s=120)
    assert second.stop() == 0
    after = min(p.predicted_time_ms for p in outcomes.predictions if p.predicted_time_ms / 1000 > killed)
    flagged, unflagged = outcomes.duplicates()
    by_record = outcomes.by_record()
    return {
        "up_s": (up or killed) - killed,
        "ready_s": (ready or killed) - killed,
        "first_prediction_s": after / 1000 - killed,
        "items_in": ITEMS,
        "records_with_outcome": len(by_record),
        "outcomes_out": sum(by_record.values()),
        "flagged": flagged,
        "unflagged": unflagged,
    }


def plain_run(stack: LocalStack, index: int) -> float:
    prefix = f"plain{index}{int(time.time())}"
    ensure_topics(stack.bootstrap_servers, prefix, sample_partitions=2)
    topic = TopicNames(prefix).samples
    produce_digits(stack.bootstrap_servers, topic, 50)
    group = f"g-{prefix}"
    args = [sys.executable, "-c", PLAIN_CONSUMER, stack.bootstrap_servers, group, topic]
    first = subprocess.Popen([*args, "kill"], stdout=subprocess.PIPE, text=True)
    assert first.stdout is not None
    first.stdout.readline()  # it consumed: a member of the group
    first.kill()
    first.wait()
    killed = time.time()
    second = subprocess.run([*args, "stop"], capture_output=True, text=True, timeout=120, check=True)
    return float(second.stdout.split()[0]) - killed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    load_start = os.getloadavg()
    runs, plain = [], []
    with tempfile.TemporaryDirectory() as tmp, LocalStack(run_dir=tmp) as stack:
        for i in range(args.runs):
            runs.append(trainer_run(stack, Path(tmp), i))
            plain.append(plain_run(stack, i))
    load_end = os.getloadavg()
    median = {k: statistics.median(float(r[k]) for r in runs) for k in ("up_s", "ready_s", "first_prediction_s")}
    plain_median = statistics.median(plain)
    lines = [
        "# kill -9 recovery (trainer.mid-record:kill@150, then a new `ferret run`)",
        "",
        f"Command: `/work/tools/timed .venv/bin/python -m benchmarks.reliability.kill_recovery --runs {args.runs}`",
        f"Load average at start {load_start[0]:.2f}, at end {load_end[0]:.2f}. "
        "Session timeout 2 s, no static membership.",
        "",
        "| run | kill → up (s) | kill → ready (s) | kill → first prediction (s) | items in | records with an outcome "
        "| outcomes out | re-emissions flagged | unflagged | plain consumer: kill → first record (s) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for i, (r, p) in enumerate(zip(runs, plain, strict=True)):
        lines.append(
            f"| {i} | {r['up_s']:.2f} | {r['ready_s']:.2f} | {r['first_prediction_s']:.2f} | {r['items_in']} "
            f"| {r['records_with_outcome']} | {r['outcomes_out']} | {r['flagged']} | {r['unflagged']} | {p:.2f} |"
        )
    lines += [
        f"| median | {median['up_s']:.2f} | {median['ready_s']:.2f} | {median['first_prediction_s']:.2f} "
        f"| | | | | | {plain_median:.2f} |",
        "",
        f"Goal ≤ 5 s kill → next prediction: median {median['first_prediction_s']:.2f} s "
        f"({'met' if median['first_prediction_s'] <= 5 else 'missed'}); trainer / plain consumer = "
        f"{median['first_prediction_s'] / plain_median:.2f}.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "kill_recovery.md").write_text(text)
    payload = {"runs": runs, "plain_consumer_s": plain, "load": [load_start[0], load_end[0]]}
    (RESULTS / "kill_recovery.json").write_text(json.dumps(payload, indent=1) + "\n")


if __name__ == "__main__":
    main()
