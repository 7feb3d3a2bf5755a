"""Recovery after kill -9, measured on the real stack: a paced MNIST stream through ``ferret run`` on executor
processes, and mid-stream one of

- ``executor``: kill -9 of one executor process; the trainer restarts its executors in place
  (``ProcessLearner._recover``) and the stream goes on where it was;
- ``trainer``: kill -9 of the trainer under ``ferret run --supervise``; the supervisor starts it again and
  it resumes from its last snapshot and committed offsets.

Per run: the time from the kill to the first prediction published after it (``recovery_s``), the longest
gap between two predictions, and the outcomes read back from the predictions topic: items without a
prediction (``lost``), items predicted twice with the second copy flagged (``flagged``) or not
(``unflagged``), and for ``executor`` the trainer's own measure of the in-place restart (its log line).
Predictions never stop on an executor kill (the record path predicts with the master in shared memory);
what stops is training, for the restart. Prints a table and writes ``results/recovery.{md,json}``.

    .venv/bin/python -m benchmarks.live.recovery --runs 3
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
from confluent_kafka import Consumer, Producer, TopicPartition

from benchmarks.service import harness as h
from ferret_core.data import load_dataset
from services.config.data_root import default_data_root
from services.control.client import ControlClient
from services.kafka.admin import TopicNames, ensure_topics
from services.kafka.record_codec import encode_sample
from services.localstack import LocalStack, free_port
from services.proto_gen.ferret.v1 import messages_pb2

ROOT = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).resolve().parent / "results"
FERRET = [sys.executable, "-m", "services.cli.main"]
RATE = 100.0  # items/s: well inside what the trainer keeps up with, so a gap is the recovery's
ITEMS = 1500  # 15 s of stream
WARM_UP = 50  # items produced at once, predicted before the paced stream starts (the group has joined)
KILL_AT = 600  # the kill comes once this many items were produced
RESTARTED = re.compile(r"executors restarted from .* in (\d+) ms")  # ProcessLearner._recover's log line
SNAPSHOT_AT = 400  # a snapshot is asked for here (the supervised restart resumes from it)


def children(pid: int) -> list[int]:
    try:
        return [int(c) for t in Path(f"/proc/{pid}/task").glob("*") for c in (t / "children").read_text().split()]
    except OSError:
        return []


def executor_pids(pid: int) -> list[int]:
    """The children of the torch forkserver below ``pid`` (the executor processes)."""
    found: list[int] = []
    for child in children(pid):
        try:
            if b"forkserver" in Path(f"/proc/{child}/cmdline").read_bytes():
                found += children(child)
        except OSError:
            pass
        found += executor_pids(child)
    return found


def trainer_env(stack: LocalStack, prefix: str, port: int) -> dict[str, str]:
    return {
        **os.environ,
        "FERRET_KAFKA_BOOTSTRAP_SERVERS": stack.bootstrap_servers,
        "FERRET_KAFKA_TOPIC_PREFIX": prefix,
        "FERRET_KAFKA_GROUP_ID": f"trainer-{prefix}",
        "FERRET_KAFKA_INSTANCE_ID": "replica-0",
        "FERRET_KAFKA_SESSION_TIMEOUT_MS": "6000",
        "FERRET_KAFKA_SAMPLE_PARTITIONS": "1",
        "FERRET_REDIS_URL": stack.redis_url,
        "FERRET_REDIS_NAMESPACE": prefix,
        "FERRET_REDIS_SNAPSHOT_INTERVAL_S": "0",
        "FERRET_REDIS_HMAC_KEY": stack.snapshot_key,
        "FERRET_TRAINER_DATASET": "mnist",
        "FERRET_TRAINER_MODEL": "mnistnet",
        "FERRET_TRAINER_PROFILE": str(ROOT / "benchmarks" / "profiles" / "mnistnet.json"),
        "FERRET_TRAINER_EXECUTORS": "processes",
        "FERRET_TRAINER_STREAM_RATE": f"{RATE:g}",
        "FERRET_CONTROL_LISTEN": f"127.0.0.1:{port}",
        "FERRET_METRICS_PORT": "null",
    }


def wait_ready(target: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with ControlClient(target) as client:
                client.get_status()
                return
        except Exception:
            time.sleep(0.2)
    raise SystemExit(f"the trainer at {target} did not answer within {timeout:g} s")


def wait_predicted(target: str, count: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    with ControlClient(target) as client:
        while client.get_status().predictions_published < count:
            if time.monotonic() > deadline:
                raise SystemExit(f"the trainer did not predict {count} items within {timeout:g} s")
            time.sleep(0.1)


def read_back(bootstrap: str, topic: str, expected: int, timeout: float = 60.0) -> list[Any]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{uuid.uuid4().hex}"})
    out: list[Any] = []
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        deadline, idle = time.monotonic() + timeout, time.monotonic()
        while time.monotonic() < deadline:
            batch = [m for m in consumer.consume(500, 0.2) if not m.error()]
            if batch:
                idle = time.monotonic()
                out += [messages_pb2.Prediction.FromString(m.value()) for m in batch]
            elif len({p.sample_id for p in out}) >= expected and time.monotonic() - idle > 2.0:
                break
    finally:
        consumer.close()
    return out


def one_run(stack: LocalStack, fault: str, run: int, log_dir: Path) -> dict[str, Any]:
    prefix = f"recovery-{fault}-{run}-{uuid.uuid4().hex[:6]}"
    topics = TopicNames(prefix)
    ensure_topics(stack.bootstrap_servers, prefix, sample_partitions=1)
    port = free_port()
    target = f"127.0.0.1:{port}"
    flags = ["--supervise"] if fault == "trainer" else []
    log_path = log_dir / f"{prefix}.log"
    log = log_path.open("wb")
    trainer = subprocess.Popen(
        [*FERRET, "run", "--log-level", "INFO", *flags],
        env=trainer_env(stack, prefix, port),
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    data = load_dataset("mnist", default_data_root())
    producer = Producer({"bootstrap.servers": stack.bootstrap_servers, "linger.ms": 0})
    killed_ms = 0.0
    def send(seq: int) -> None:
        x = (data.x_train[seq] * 255).astype(np.uint8)
        sample = encode_sample(x, stream="mnist", sequence=seq, label=int(data.y_train[seq]))
        producer.produce(topics.samples, sample.SerializeToString(), key=sample.id.encode())
        producer.poll(0)

    try:
        wait_ready(target)
        for seq in range(WARM_UP):  # the trainer has its partition and predicts before the paced stream
            send(seq)
        producer.flush(10)
        wait_predicted(target, WARM_UP)
        began = time.monotonic()
        for seq in range(WARM_UP, ITEMS):
            time.sleep(max(0.0, began + (seq - WARM_UP) / RATE - time.monotonic()))
            send(seq)
            if seq == SNAPSHOT_AT:
                producer.flush(10)
                with ControlClient(target) as client:
                    client.save_snapshot()
            if seq == KILL_AT:
                producer.flush(10)
                victim = executor_pids(trainer.pid)[0] if fault == "executor" else children(trainer.pid)[0]
                killed_ms = time.time() * 1000
                os.kill(victim, signal.SIGKILL)
        producer.flush(30)
        predictions = read_back(stack.bootstrap_servers, topics.predictions, ITEMS)
    finally:
        trainer.send_signal(signal.SIGTERM)
        try:
            trainer.wait(60)
        except subprocess.TimeoutExpired:
            trainer.kill()
        log.close()
    seen = Counter(p.sample_id for p in predictions)
    twice = [s for s, n in seen.items() if n >= 2]
    flagged = sum(
        1
        for s in twice
        if sorted((p for p in predictions if p.sample_id == s), key=lambda p: p.predicted_time_ms)[-1].duplicate
    )
    times = sorted(p.predicted_time_ms for p in predictions)
    after = [t for t in times if t > killed_ms]
    before = [t for t in times if t <= killed_ms]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    return {
        "fault": fault,
        "run": run,
        "items": ITEMS,
        "predicted": len(seen),
        "lost": ITEMS - len(seen),
        "flagged": flagged,
        "unflagged": len(twice) - flagged,
        "recovery_s": (after[0] - killed_ms) / 1000 if after else None,
        "longest_gap_s": max(gaps) / 1000 if gaps else None,
        "last_before_kill_s": (killed_ms - before[-1]) / 1000 if before else None,
        # executor: the trainer's own measure of the in-place restart (close, weights, new clock)
        "restart_ms": next((float(m) for m in RESTARTED.findall(log_path.read_text(errors="replace"))), None),
    }


def render(rows: list[dict[str, Any]], command: str) -> str:
    lines = [
        "# Recovery after kill -9 (MNIST/MNISTNet on executor processes, 100 items/s)",
        "",
        f"Command: `{command}` at {h.git_head()} — {os.cpu_count()} CPUs; load before {h.load_average()}.",
        "",
        "| fault | run | items | predicted | lost | duplicates flagged | unflagged | kill → next prediction s "
        "| longest gap s | executors restarted in ms |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['fault']} | {r['run']} | {r['items']} | {r['predicted']} | {r['lost']} | {r['flagged']} | "
            f"{r['unflagged']} | {r['recovery_s']:.2f} | {r['longest_gap_s']:.2f} | "
            f"{'—' if r['restart_ms'] is None else round(r['restart_ms'])} |"
        )
    lines += ["", "| fault | median kill → next prediction s | median longest gap s |", "|---|---:|---:|"]
    for fault in sorted({r["fault"] for r in rows}):
        mine = [r for r in rows if r["fault"] == fault]
        lines.append(
            f"| {fault} | {statistics.median(r['recovery_s'] for r in mine):.2f} | "
            f"{statistics.median(r['longest_gap_s'] for r in mine):.2f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--faults", nargs="+", default=["executor", "trainer"], choices=["executor", "trainer"])
    args = parser.parse_args(argv)
    command = "python -m benchmarks.live.recovery " + " ".join(sys.argv[1:] if argv is None else argv)
    rows = []
    stack = LocalStack().start()
    log_dir = Path(os.environ.get("TMPDIR", "/tmp"))
    try:
        for run in range(args.runs):
            for fault in args.faults:
                row = one_run(stack, fault, run, log_dir)
                print(json.dumps(row), flush=True)
                rows.append(row)
    finally:
        stack.stop()
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "recovery.json").write_text(json.dumps({"command": command, "rows": rows}, indent=2) + "\n")
    table = render(rows, command)
    (RESULTS / "recovery.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
