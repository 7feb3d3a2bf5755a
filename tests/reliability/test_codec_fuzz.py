"""Fuzzing the trainer's input side: every record gets exactly one outcome at the codec.

2,500 generated records (1,000 arbitrary byte strings, 1,500 structured Samples with hostile values:
NaN, ±inf, float32 1e6 and ±3e38, float16 65504, wrong shapes and sizes, huge ids, out-of-range labels)
go through :class:`SampleDecoder` and, when rejected, :func:`dead_letter_record`. For each: no exception,
exactly one outcome (a valid sample, or a rejection with a known reason whose dead letter fits the
producer's limit), and a valid sample is of the model's shape, finite and inside the input range.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from services.kafka.record_codec import (
    DEFAULT_INPUT_RANGE,
    MAX_ID_BYTES,
    REASONS,
    Rejection,
    SampleDecoder,
    ValidSample,
    dead_letter_record,
)
from services.proto_gen.ferret.v1.messages_pb2 import Sample, Tensor

SHAPE = (1, 4, 4)
CLASSES = 10
LIMIT = 64 * 1024  # a small producer limit, so the truncation path is exercised often
DECODERS = {
    "none": SampleDecoder(SHAPE, CLASSES),
    "clip": SampleDecoder(SHAPE, CLASSES, normaliser="clip"),
    "minmax": SampleDecoder(SHAPE, CLASSES, normaliser="minmax"),
}
HOSTILE = [math.nan, math.inf, -math.inf, 1e6, 3e38, -3e38, 65504.0, 1e-45, 0.0, -0.0, 1000.0, -1000.0001]


def fuzz(examples: int) -> settings:
    """Explicit example counts (the suite's default hypothesis profile runs fewer)."""
    return settings(max_examples=examples, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)


class Record:
    """A consumed record as :func:`dead_letter_record` reads it."""

    def __init__(self, value: bytes | None, key: bytes | None = None, headers: list | None = None) -> None:
        self._value, self._key, self._headers = value, key, headers

    def topic(self) -> str:
        return "t.samples"

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return 42

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def headers(self) -> list | None:
        return self._headers


def one_outcome(decoder: SampleDecoder, record: Record) -> str:
    """Decode; check the single outcome's invariants; return the outcome's name."""
    result = decoder.decode(record.value())
    if isinstance(result, ValidSample):
        x = result.x
        assert tuple(x.shape) == SHAPE and x.dtype.is_floating_point
        assert bool(x.isfinite().all())
        low, high = decoder.input_range
        assert low <= float(x.min()) and float(x.max()) <= high
        assert result.label is None or 0 <= result.label < CLASSES
        assert len(result.sample_id.encode()) <= MAX_ID_BYTES
        return "valid"
    assert isinstance(result, Rejection) and result.reason in REASONS and result.detail
    letter = dead_letter_record(record, result, max_bytes=LIMIT)
    size = len(letter.key or b"") + len(letter.value or b"") + sum(len(k) + len(v) for k, v in letter.headers)
    assert size <= LIMIT
    assert dict(letter.headers)["ferret.dlq.reason"] == result.reason.encode()
    return result.reason


@fuzz(1000)
@given(value=st.one_of(st.none(), st.binary(max_size=2048)), normaliser=st.sampled_from(sorted(DECODERS)))
def test_arbitrary_bytes_get_one_outcome(value: bytes | None, normaliser: str) -> None:
    event(one_outcome(DECODERS[normaliser], Record(value)))


def tensors() -> st.SearchStrategy[Tensor]:
    dtypes = st.sampled_from(["uint8", "float16", "float32", "float64"] * 3 + ["int64", "bfloat16", ""])
    shapes = st.sampled_from([list(SHAPE)] * 4 + [[]]) | st.lists(st.integers(-3, 6), max_size=4)
    tame = st.floats(-1000, 1000, width=32)
    values = st.one_of(tame, tame, tame, st.sampled_from(HOSTILE), st.floats(width=32))

    @st.composite
    def build(draw: st.DrawFn) -> Tensor:
        dtype, shape = draw(dtypes), draw(shapes)
        count = math.prod(shape) if all(s >= 0 for s in shape) else 4
        if dtype in ("float16", "float32", "float64") and draw(st.integers(0, 4)) > 0:
            numbers = draw(st.lists(values, min_size=count, max_size=count))
            with np.errstate(over="ignore"):
                data = np.array(numbers, dtype=np.float64).astype(dtype).tobytes()
        elif dtype == "uint8" and draw(st.integers(0, 4)) > 0:
            data = bytes(draw(st.lists(st.integers(0, 255), min_size=count, max_size=count)))
        else:
            data = draw(st.binary(max_size=256))
        return Tensor(shape=shape, dtype=dtype, data=data)

    return build()


@fuzz(1500)
@given(
    ident=st.sampled_from(["s/1", "mnist/7", "", "x" * (MAX_ID_BYTES + 1)]) | st.text(max_size=20),
    stream=st.text(max_size=10),
    tensor=st.none() | tensors() | tensors() | tensors(),
    label=st.none() | st.integers(0, CLASSES - 1) | st.integers(-(2**63), 2**63 - 1) | st.integers(-2, CLASSES + 2),
    key=st.none() | st.binary(max_size=16) | st.binary(max_size=16) | st.just(b"k" * (LIMIT * 2)),
    headers=st.lists(st.tuples(st.text(min_size=1, max_size=8), st.binary(max_size=512)), max_size=200),
    normaliser=st.sampled_from(sorted(DECODERS)),
)
def test_structured_samples_get_one_outcome(
    ident: str,
    stream: str,
    tensor: Tensor | None,
    label: int | None,
    key: bytes | None,
    headers: list[tuple[str, bytes]],
    normaliser: str,
) -> None:
    sample = Sample(id=ident, sequence=1, stream=stream)
    if tensor is not None:
        sample.tensor.CopyFrom(tensor)
    if label is not None:
        sample.label = label
    event(one_outcome(DECODERS[normaliser], Record(sample.SerializeToString(), key, headers)))


@pytest.mark.parametrize(
    ("dtype", "value"),
    [("float32", 1e6), ("float32", 3e38), ("float32", -3e38), ("float16", 65504.0)],
)
def test_the_issues_poisonous_inputs_are_rejected_by_default(dtype: str, value: float) -> None:
    data = np.full(SHAPE, value, dtype=dtype).tobytes()
    sample = Sample(id="s/1", tensor=Tensor(shape=list(SHAPE), dtype=dtype, data=data))
    result = DECODERS["none"].decode(sample.SerializeToString())
    assert isinstance(result, Rejection) and result.reason == "out_of_range"
    clipped = DECODERS["clip"].decode(sample.SerializeToString())
    assert isinstance(clipped, ValidSample) and float(clipped.x.max()) <= DEFAULT_INPUT_RANGE[1]


def test_a_5_mib_record_is_too_large_and_its_dead_letter_fits() -> None:
    value = b"\x0a" + b"x" * (5 * 2**20)
    record = Record(value, key=b"s/1", headers=[("origin", b"producer-1")])
    result = DECODERS["none"].decode(value)
    assert isinstance(result, Rejection) and result.reason == "too_large"
    letter = dead_letter_record(record, result)  # the default limit: librdkafka's message.max.bytes
    headers = dict(letter.headers)
    assert letter.truncated and headers["ferret.dlq.truncated"] == b"true"
    assert headers["ferret.dlq.original_bytes"] == str(len(value)).encode()
    assert headers["origin"] == b"producer-1" and letter.key == b"s/1"
    assert len(letter.value or b"") + sum(len(k) + len(v) for k, v in letter.headers) <= 1_000_000
    assert value.startswith(letter.value or b"x")


def test_minmax_rescales_values_spanning_beyond_float32() -> None:
    """Found by the fuzz: ±3e38 in one sample made float32's x − min overflow to inf and NaN came out."""
    values = np.zeros(SHAPE, dtype=np.float32)
    values.flat[-2], values.flat[-1] = 3e38, -3e38
    sample = Sample(id="s/1", tensor=Tensor(shape=list(SHAPE), dtype="float32", data=values.tobytes()))
    result = DECODERS["minmax"].decode(sample.SerializeToString())
    assert isinstance(result, ValidSample)
    assert bool(result.x.isfinite().all())
    assert float(result.x.min()) == -1000.0 and float(result.x.max()) == 1000.0
