"""The published Prediction and its downstream reading, without a broker: the trainer's message (label,
top-k, content-type header), the typed record a reader gets back, the DataFrame helper (pandas optional)
and ``ferret predictions tail``'s output. The reader against a real broker: tests/integration/test_downstream.py."""

from __future__ import annotations

import io
import json
import math
import sys

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from ferret_core.engine import SkipReason
from services.cli.predictions_cmd import TABLE_HEADER, table_row, write
from services.kafka import content_type
from services.kafka.record_codec import ValidSample
from services.predictions import (
    CONTENT_TYPE,
    ClassProbability,
    MissingExtra,
    PredictionReadError,
    PredictionRecord,
    to_dataframe,
)
from services.proto_gen.ferret.v1 import messages_pb2
from services.trainer.learner import ArrivalOutcome
from services.trainer.predictions import HEADERS, prediction_message


class FakeRecord:
    """What a confluent_kafka.Message gives a reader."""

    def __init__(self, value: bytes | None, headers: list[tuple[str, bytes]] | None = None, offset: int = 7) -> None:
        self._value, self._headers, self._offset = value, headers, offset

    def topic(self) -> str:
        return "ferret.predictions"

    def partition(self) -> int:
        return 1

    def offset(self) -> int:
        return self._offset

    def timestamp(self) -> tuple[int, int]:
        return (1, 1_700_000_000_123)

    def value(self) -> bytes | None:
        return self._value

    def headers(self) -> list[tuple[str, bytes]] | None:
        return self._headers


def sample(label: int | None) -> ValidSample:
    return ValidSample("digits/5", 5, 1_700_000_000_000, torch.zeros(1, 8, 8), label, 0, "digits")


def published(label: int | None, outcome: ArrivalOutcome) -> messages_pb2.Prediction:
    return prediction_message(
        sample(label), outcome, item=4, online_accuracy=50.0, duplicate=False, plan_version=2,
        instance_id="replica-0", partition=0, offset=9, latency_ms=3.5, time_ms=1_700_000_000_042,
    )  # fmt: skip


TOP = ((3, 0.75), (1, 0.125), (0, 0.0625))


def test_the_trainer_publishes_the_label_when_known_and_the_top_k() -> None:
    labelled = published(3, ArrivalOutcome(3, 0.75, 11, None, 0, TOP))
    assert labelled.HasField("label") and labelled.label == 3 and labelled.correct
    assert [(p.class_index, p.probability) for p in labelled.top_k] == list(TOP)
    unlabelled = published(None, ArrivalOutcome(3, 0.75, 11, SkipReason.NO_LABEL, None, TOP[:1]))
    assert not unlabelled.HasField("label") and not unlabelled.has_label and len(unlabelled.top_k) == 1
    assert not published(0, ArrivalOutcome(3, 0.75, 11, None, 0)).top_k  # a learner that reports none
    assert HEADERS == [("content-type", b"application/x-protobuf; messageType=ferret.v1.Prediction")]


def test_a_reader_gets_typed_frozen_records_back() -> None:
    message = published(1, ArrivalOutcome(3, 0.75, 11, None, 2, TOP))
    record = PredictionRecord.from_kafka(FakeRecord(message.SerializeToString(), HEADERS))
    assert (record.label, record.correct, record.has_label) == (1, False, True)
    assert record.top_k == tuple(ClassProbability(c, p) for c, p in TOP)
    assert (record.decision, record.worker, record.model_version, record.plan_version) == ("dispatched", 2, 11, 2)
    assert (record.topic, record.partition, record.offset, record.timestamp_ms) == (
        "ferret.predictions", 1, 7, 1_700_000_000_123
    )  # fmt: skip
    assert (record.source_partition, record.source_offset, record.instance_id) == (0, 9, "replica-0")
    with pytest.raises(AttributeError):
        record.label = 2  # type: ignore[misc]
    skipped = PredictionRecord.from_message(published(None, ArrivalOutcome(0, 0.5, 0, SkipReason.BUSY, None)))
    assert (skipped.decision, skipped.worker, skipped.label, skipped.correct) == ("busy", None, None, None)
    json.dumps(record.to_dict())  # plain values


def test_records_of_older_trainers_without_header_or_new_fields_still_read() -> None:
    old = messages_pb2.Prediction(sample_id="a/1", predicted_class=2, has_label=True, correct=True)
    record = PredictionRecord.from_kafka(FakeRecord(old.SerializeToString(), headers=None))
    assert (record.label, record.correct, record.top_k) == (None, True, ())
    assert PredictionRecord.from_message(messages_pb2.Prediction(decision=99)).decision == "unknown_99"  # type: ignore[arg-type]


def test_a_record_of_another_message_or_undecodable_is_a_clear_error() -> None:
    sample_bytes = messages_pb2.Sample(id="x").SerializeToString()
    with pytest.raises(PredictionReadError, match=r"offset 7: content-type is .*messageType=ferret\.v1\.Sample"):
        PredictionRecord.from_kafka(FakeRecord(sample_bytes, [content_type.header(messages_pb2.Sample)]))
    with pytest.raises(PredictionReadError, match=r"not a ferret\.v1\.Prediction"):
        PredictionRecord.from_kafka(FakeRecord(b"\xff\xff\xff", HEADERS))
    with pytest.raises(PredictionReadError, match=r"content-type is .application/json."):
        PredictionRecord.from_kafka(FakeRecord(b"{}", [("Content-Type", b"application/json")]))
    assert issubclass(PredictionReadError, ValueError)


@given(st.sampled_from(["content-type", "Content-Type", "CONTENT-TYPE"]), st.booleans())
def test_content_type_header_round_trips(name: str, quoted: bool) -> None:
    full = messages_pb2.Prediction.DESCRIPTOR.full_name
    value = f"application/x-protobuf; messageType={json.dumps(full) if quoted else full}"
    parsed = content_type.parse([("other", b"x"), (name, value.encode())])
    assert parsed is not None and parsed.names(messages_pb2.Prediction) and not parsed.names(messages_pb2.Sample)
    assert str(parsed) == CONTENT_TYPE == content_type.content_type(messages_pb2.Prediction())
    assert content_type.parse([("other", b"x")]) is None and content_type.parse(None) is None


def records(n: int) -> list[PredictionRecord]:
    out = []
    for i in range(n):
        label = i if i % 2 else None
        skipped = None if label is not None else SkipReason.NO_LABEL
        message = published(label, ArrivalOutcome(i, 0.5, i, skipped, 0 if skipped is None else None, TOP))
        out.append(PredictionRecord.from_kafka(FakeRecord(message.SerializeToString(), HEADERS, offset=i)))
    return out


def test_to_dataframe_one_row_per_record_with_nullable_label() -> None:
    pytest.importorskip("pandas", reason="pandas (the pandas extra) is not installed")
    frame = to_dataframe(records(4))
    assert len(frame) == 4 and list(frame["offset"]) == [0, 1, 2, 3]
    assert frame["label"].isna().tolist() == [True, False, True, False] and str(frame["label"].dtype) == "Int64"
    assert frame["correct"].isna().sum() == 2 and frame["top_k"][0] == TOP
    assert str(frame["predicted_time"].dt.tz) == "UTC"
    assert len(to_dataframe([])) == 0


def test_to_dataframe_without_pandas_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pandas", None)  # `import pandas` raises ImportError
    with pytest.raises(MissingExtra, match=r"pip install 'ferret-ocl\[pandas\]'"):
        to_dataframe(records(1))
    assert issubclass(MissingExtra, ImportError)


def test_tail_writes_strict_json_lines_or_a_table() -> None:
    rs = records(3)
    nan = PredictionRecord.from_message(messages_pb2.Prediction(sample_id="n/1", confidence=math.nan))
    out = io.StringIO()
    write([*rs, nan], out, as_json=True)
    lines = out.getvalue().splitlines()
    decoded = [json.loads(line) for line in lines]  # strict: no bare NaN
    assert [d["sample_id"] for d in decoded] == ["digits/5"] * 3 + ["n/1"] and decoded[-1]["confidence"] is None
    assert decoded[1]["top_k"][0] == {"class_index": 3, "probability": 0.75} and decoded[0]["label"] is None
    out = io.StringIO()
    write(rs, out, as_json=False)
    table = out.getvalue().splitlines()
    assert table[0] == TABLE_HEADER and len(table) == 4
    assert table[2] == table_row(rs[1]) and "3:0.75 1:0.12 0:0.06" in table[2] and " y " not in table[1]


@pytest.mark.parametrize("k", [0, 1, 3, 12])
def test_the_engine_learner_reports_trainer_prediction_top_k_classes(k: int) -> None:
    from services.config import load_settings
    from services.trainer.engine_learner import EngineLearner
    from services.trainer.runner import build_zoo_model
    from tests.unit.test_engine_support import make_plan

    env = {"FERRET_TRAINER_DATASET": "digits", "FERRET_TRAINER_MODEL": "mlp", "FERRET_TRAINER_PREDICTION_TOP_K": str(k)}
    settings = load_settings(None, env=env)
    model = build_zoo_model(settings)
    learner = EngineLearner(model, make_plan(1, 1, num_units=model.num_units), settings)
    try:
        outcome = learner.arrive(0, torch.rand(1, 8, 8), 3)
    finally:
        learner.close()
    assert len(outcome.top_k) == min(k, 10)  # digits: 10 classes
    if k:
        assert outcome.top_k[0] == (outcome.predicted_class, outcome.confidence)
    assert load_settings(None, env={}).trainer.prediction_top_k == 3
