"""Downstream of a live ``ferret run`` (a separate process on the real engine, the real broker): the
Python reader and ``ferret predictions tail`` read back every prediction with its label and top-k and the
content-type header; ``promtool check metrics`` passes on the live endpoint; the README's "Downstream"
commands work as written (docs/predictions.md, docs/metrics.md)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from ferret_core.data import load_dataset
from services.control.client import ControlClient
from services.kafka.admin import TopicNames, ensure_topics
from services.localstack.ports import free_port
from services.predictions import CONTENT_TYPE, iter_predictions, to_dataframe

from .test_trainer_process import FERRET, ROOT, TrainerProcess, control, wait_status
from .trainer_support import SNAPSHOT_KEY, produce_digits

pytestmark = [pytest.mark.integration, pytest.mark.slow]
LABELLED, UNLABELLED = 120, 30
TOTAL = LABELLED + UNLABELLED


@dataclass(frozen=True)
class Live:
    bootstrap: str
    prefix: str
    metrics_url: str
    labels: dict[str, int | None]  # sample id → the label it was produced with (None: without)
    env: dict[str, str]


@pytest.fixture(scope="module")
def live(bootstrap_servers: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    """One trainer (MLP on digits) that predicted 150 items (30 without a label) and re-planned once."""
    prefix = f"t{uuid.uuid4().hex[:10]}"
    ensure_topics(bootstrap_servers, prefix, sample_partitions=2)
    metrics_port = free_port()
    env = {
        **os.environ,
        "FERRET_KAFKA_BOOTSTRAP_SERVERS": bootstrap_servers,
        "FERRET_KAFKA_TOPIC_PREFIX": prefix,
        "FERRET_KAFKA_GROUP_ID": f"g-{prefix}",
        "FERRET_KAFKA_INSTANCE_ID": "replica-0",
        "FERRET_KAFKA_SAMPLE_PARTITIONS": "2",
        "FERRET_REDIS_URL": redis_url,
        "FERRET_REDIS_NAMESPACE": prefix,
        "FERRET_REDIS_SNAPSHOT_INTERVAL_S": "0",
        "FERRET_REDIS_HMAC_KEY": SNAPSHOT_KEY,
        "FERRET_TRAINER_DATASET": "digits",
        "FERRET_TRAINER_MODEL": "mlp",
        "FERRET_TRAINER_MAX_WORKERS": "2",
        # a fixed arrival interval (the paper's rate): no re-plan on the measured rate, so the one budget
        # change is the one re-plan the metrics must show (real-rate planning is tested in test_trainer_process)
        "FERRET_TRAINER_ARRIVAL_INTERVAL": "auto",
        "FERRET_CONTROL_LISTEN": f"127.0.0.1:{free_port()}",
        "FERRET_METRICS_PORT": str(metrics_port),
    }
    trainer = TrainerProcess(env, tmp_path_factory.mktemp("downstream") / "trainer.log")
    client = ControlClient(trainer.target)
    try:
        samples = TopicNames(prefix).samples
        labelled = produce_digits(bootstrap_servers, samples, LABELLED)
        unlabelled = produce_digits(bootstrap_servers, samples, UNLABELLED, start=LABELLED, labels=False)
        wait_status(client, "predictions_published", TOTAL)
        plan = json.loads(client.get_plan().plan_json)
        budget = control(trainer.target, "budget", str((plan["min_feasible_bytes"] + plan["planned_bytes"]) // 2))
        assert budget.returncode == 0, budget.stderr
        y = load_dataset("digits", None).y_train
        labels: dict[str, int | None] = {i: int(y[n]) for n, i in enumerate(labelled)}
        labels.update(dict.fromkeys(unlabelled))
        yield Live(bootstrap_servers, prefix, f"http://127.0.0.1:{metrics_port}/metrics", labels, env)
    finally:
        client.close()
        assert trainer.stop() == 0


def scrape(url: str) -> str:
    return str(urllib.request.urlopen(url, timeout=10).read().decode())


def sample_value(exposition: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)} (\S+)$", exposition, re.MULTILINE)
    assert match, f"{name} not exported"
    return float(match.group(1))


def test_promtool_check_metrics_on_the_live_trainer(live: Live) -> None:
    from tests.unit.test_trainer_metrics import promtool_check

    exposition = scrape(live.metrics_url)
    out = promtool_check(exposition)
    assert out.returncode == 0 and not (out.stdout + out.stderr).strip(), out.stdout + out.stderr
    assert sample_value(exposition, "ferret_predictions_published_total") == TOTAL
    assert sample_value(exposition, "ferret_prediction_latency_seconds_count") == TOTAL
    assert sample_value(exposition, "ferret_replans_total") == 1
    assert sample_value(exposition, "ferret_replan_duration_seconds_count") == 1
    assert sample_value(exposition, "ferret_plan_version") == 2
    correct = sample_value(exposition, "ferret_correct_predictions_total")
    labelled = sample_value(exposition, "ferret_labelled_predictions_total")
    assert labelled == LABELLED
    assert sample_value(exposition, "ferret_online_accuracy_ratio") == pytest.approx(correct / labelled)
    assert sample_value(exposition, 'ferret_skipped_total{reason="no_label"}') == UNLABELLED
    assert sample_value(exposition, "ferret_budget_bytes") >= sample_value(exposition, "ferret_planned_bytes") > 0


def test_the_reader_gets_every_prediction_with_label_and_top_k(live: Live) -> None:
    records = list(iter_predictions(live.bootstrap, live.prefix))
    assert sorted(r.sample_id for r in records) == sorted(live.labels)  # one each, from the beginning
    for r in records:
        label = live.labels[r.sample_id]
        assert r.label == label and r.has_label == (label is not None)
        assert r.correct == (None if label is None else r.predicted_class == label)
        assert r.decision == "no_label" if label is None else r.decision in ("dispatched", "busy")
        assert len(r.top_k) == 3 and (r.top_k[0].class_index, r.top_k[0].probability) == (
            r.predicted_class, r.confidence
        )  # fmt: skip
        probabilities = [p.probability for p in r.top_k]
        assert probabilities == sorted(probabilities, reverse=True) and 0 < sum(probabilities) <= 1 + 1e-6
        assert r.topic == TopicNames(live.prefix).predictions and r.timestamp_ms is not None
    frame = to_dataframe(records)
    assert len(frame) == TOTAL and frame["label"].isna().sum() == UNLABELLED


def test_every_record_names_its_message_in_a_content_type_header(live: Live) -> None:
    consumer = Consumer({"bootstrap.servers": live.bootstrap, "group.id": f"h-{uuid.uuid4().hex}",
                         "enable.auto.commit": False})  # fmt: skip
    consumer.assign([TopicPartition(TopicNames(live.prefix).predictions, 0, OFFSET_BEGINNING)])
    try:
        deadline, message = time.monotonic() + 30, None
        while message is None or message.error():
            assert time.monotonic() < deadline, "no prediction read"
            message = consumer.poll(0.5)
        assert message.headers() == [("content-type", CONTENT_TYPE.encode())]
    finally:
        consumer.close()


def tail(live: Live, *args: str) -> subprocess.CompletedProcess[str]:
    command = [*FERRET, "predictions", "tail", "--bootstrap-servers", live.bootstrap, "--topic-prefix", live.prefix]
    return subprocess.run([*command, *args], capture_output=True, text=True, cwd=ROOT, timeout=120, check=False)


def test_a_group_resumes_where_it_committed_and_every_read_is_bounded(live: Live) -> None:
    group = f"readers-{uuid.uuid4().hex[:6]}"
    first = tail(live, "--group", group, "--from-beginning", "--max", "100", "--json")
    rest = tail(live, "--group", group, "--from-beginning", "--no-follow", "--json")
    assert first.returncode == rest.returncode == 0, first.stderr + rest.stderr
    ids = [json.loads(line)["sample_id"] for line in first.stdout.splitlines() + rest.stdout.splitlines()]
    assert len(ids) == TOTAL and set(ids) == set(live.labels)  # the second read began where the first committed
    started = time.monotonic()
    followed = list(iter_predictions(live.bootstrap, live.prefix, follow=True, timeout=3.0))
    assert len(followed) == TOTAL and time.monotonic() - started < 30  # follow ends at the timeout
    assert len(list(iter_predictions(live.bootstrap, live.prefix, follow=True, max_records=7))) == 7


def test_tail_into_a_closed_pipe_ends_quietly(live: Live) -> None:
    command = [*FERRET, "predictions", "tail", "--bootstrap-servers", live.bootstrap, "--topic-prefix",
               live.prefix, "--from-beginning", "--json", "--timeout", "60"]  # fmt: skip
    script = f"{shlex.join(command)} | head -n 1; echo \"exit=${{PIPESTATUS[0]}}\" >&2"
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert len(out.stdout.splitlines()) == 1 and json.loads(out.stdout)["sample_id"] in live.labels
    assert out.stderr.strip() == "exit=141", out.stderr  # 128 + SIGPIPE, no traceback


def test_missing_topic_is_one_line_and_exit_1(live: Live) -> None:
    out = tail(live, "--topic-prefix", f"nope{uuid.uuid4().hex[:6]}", "--no-follow")
    assert out.returncode == 1 and "does not exist" in out.stderr and "Traceback" not in out.stderr


def readme_downstream() -> tuple[list[str], str]:
    section = (ROOT / "README.md").read_text(encoding="utf-8").split("## Downstream", 1)[1].split("\n## ", 1)[0]
    bash = section.split("```bash", 1)[1].split("```", 1)[0]
    python = section.split("```python", 1)[1].split("```", 1)[0]
    return [line.split(" #")[0].strip() for line in bash.strip().splitlines() if line.strip()], python


def test_the_readme_downstream_commands_work_as_written(live: Live) -> None:
    commands, python = readme_downstream()
    env = {k: v for k, v in live.env.items() if not k.startswith("FERRET_") or k.startswith("FERRET_KAFKA_")}
    (ROOT / "out").mkdir(exist_ok=True)
    for command in commands:
        argv = shlex.split(command)
        redirect = argv.index(">") if ">" in argv else None
        target = argv[redirect + 1] if redirect is not None else None
        argv = argv[:redirect] if redirect is not None else argv
        if not (ROOT / argv[0]).is_file():  # another environment runs the tests: the same CLI, by module
            argv = [sys.executable, "-m", "services.cli.main", *argv[1:]]
        out = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)
        assert out.returncode == 0, f"{command}\n{out.stderr[-3000:]}"
        if target is not None:  # the JSON lines: every prediction, once
            (ROOT / target).write_text(out.stdout, encoding="utf-8")
            lines = [json.loads(line) for line in (ROOT / target).read_text().splitlines()]
            assert sorted(d["sample_id"] for d in lines) == sorted(live.labels)
            assert all(len(d["top_k"]) == 3 and d["label"] == live.labels[d["sample_id"]] for d in lines)
        elif "--max" in argv:  # the table: a header and five rows
            rows = out.stdout.splitlines()
            assert rows[0].startswith("time (UTC)") and len(rows) == 6, out.stdout
        else:
            assert len(out.stdout.splitlines()) == TOTAL, command
    run = subprocess.run([sys.executable, "-c", python], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "no_label" in run.stdout and "dispatched" in run.stdout
