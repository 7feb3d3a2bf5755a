"""The Sample codec: round trips, every rejection reason, and the dead letter built from a record."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch

from ferret_core.data import normalise
from ferret_core.data.stream import resize_images
from ferret_core.errors import ConfigError
from services.kafka.record_codec import (
    REASONS,
    Rejection,
    SampleDecoder,
    SampleEncoder,
    SampleRejectedError,
    ValidSample,
    dead_letter,
    dead_letter_info,
    encode_sample,
    sample_id,
)
from services.proto_gen.ferret.v1.messages_pb2 import Sample, Tensor

MNIST_SHAPE = (1, 28, 28)


def image(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, MNIST_SHAPE, dtype=np.uint8)


def valid(result: ValidSample | Rejection) -> ValidSample:
    assert isinstance(result, ValidSample), result
    return result


def test_reason_codes_are_stable() -> None:
    assert REASONS == (
        "undecodable",
        "missing_id",
        "missing_tensor",
        "bad_dtype",
        "bad_size",
        "wrong_shape",
        "non_finite",
        "label_out_of_range",
        "too_large",
        "out_of_range",
    )


def test_uint8_round_trip_keeps_mnist_at_784_bytes() -> None:
    x = image()
    sample = encode_sample(x, stream="mnist", sequence=7, label=3, task=1, event_time_ms=1234)
    assert sample.id == sample_id("mnist", 7) == "mnist/7"
    assert (sample.tensor.dtype, list(sample.tensor.shape), len(sample.tensor.data)) == ("uint8", [1, 28, 28], 784)
    decoded = valid(SampleDecoder(MNIST_SHAPE, 10).decode(sample.SerializeToString()))
    assert (decoded.sample_id, decoded.sequence, decoded.event_time_ms) == ("mnist/7", 7, 1234)
    assert (decoded.label, decoded.task, decoded.stream) == (3, 1, "mnist")
    assert decoded.x.dtype == torch.float32 and tuple(decoded.x.shape) == MNIST_SHAPE
    torch.testing.assert_close(decoded.x, normalise(x), rtol=0, atol=0)  # the same numbers as the core's stream


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_float_round_trip(dtype: str) -> None:
    x = np.random.default_rng(1).random((1, 8, 8)).astype(dtype)
    decoded = valid(
        SampleDecoder((1, 8, 8), 10).decode(encode_sample(x, stream="digits", sequence=0).SerializeToString())
    )
    assert decoded.label is None and decoded.x.dtype == torch.float32
    torch.testing.assert_close(decoded.x, torch.from_numpy(x.astype(np.float32)), rtol=0, atol=0)


def test_encoder_reuses_its_message_without_leaking_labels() -> None:
    encoder = SampleEncoder("mnist", MNIST_SHAPE, "uint8")
    decoder = SampleDecoder(MNIST_SHAPE, 10)
    ident, first = encoder.encode(image(0).tobytes(), 0, label=4, event_time_ms=5)
    ident2, second = encoder.encode(image(1).tobytes(), 1, label=None, task=2)
    assert (ident, ident2) == ("mnist/0", "mnist/1")
    a, b = valid(decoder.decode(first)), valid(decoder.decode(second))
    assert (a.label, a.event_time_ms, a.task) == (4, 5, 0)
    assert (b.label, b.task, b.sequence) == (None, 2, 1) and b.event_time_ms > 1_600_000_000_000
    torch.testing.assert_close(b.x, normalise(image(1)), rtol=0, atol=0)
    with pytest.raises(ConfigError, match="has 10 tensor bytes, expected 784"):
        encoder.encode(b"\0" * 10, 2)


def test_unsupported_arrays_are_not_encoded() -> None:
    with pytest.raises(ConfigError, match="cannot encode a int32 tensor"):
        encode_sample(np.zeros(3, dtype=np.int32), stream="s", sequence=0)


def _sample(**overrides: Any) -> bytes:
    fields: dict[str, Any] = {
        "id": "mnist/1",
        "sequence": 1,
        "stream": "mnist",
        "tensor": Tensor(shape=MNIST_SHAPE, dtype="uint8", data=bytes(784)),
        "label": 1,
    }
    fields.update(overrides)
    sample = Sample(**{k: v for k, v in fields.items() if v is not None})
    return sample.SerializeToString()


def _floats(values: list[float], dtype: str = "float32") -> Tensor:
    return Tensor(shape=[len(values)], dtype=dtype, data=np.asarray(values, dtype=dtype).tobytes())


@pytest.mark.parametrize(
    ("value", "reason", "detail"),
    [
        (None, "undecodable", "no value"),
        (b"\xff\xff\xff\xff", "undecodable", "not a ferret.v1.Sample (4 bytes)"),
        (_sample(id=None), "missing_id", "empty id"),
        (_sample(tensor=None), "missing_tensor", "mnist/1 has no tensor"),
        (_sample(tensor=Tensor(shape=MNIST_SHAPE, dtype="int32", data=bytes(784 * 4))), "bad_dtype", "'int32'"),
        (_sample(tensor=Tensor(shape=MNIST_SHAPE, dtype="", data=bytes(784))), "bad_dtype", "expected one of"),
        (_sample(tensor=Tensor(shape=MNIST_SHAPE, dtype="uint8", data=bytes(783))), "bad_size", "783 data bytes"),
        (_sample(tensor=Tensor(shape=[1, 28, 28], dtype="float32", data=bytes(784))), "bad_size", "expected 3136"),
        (_sample(tensor=Tensor(shape=[-1, 28, 28], dtype="uint8", data=bytes(784))), "bad_size", "negative"),
        (_sample(tensor=Tensor(shape=[784], dtype="uint8", data=bytes(784))), "wrong_shape", "expects [1, 28, 28]"),
        (
            _sample(tensor=Tensor(shape=[1, 28, 28], dtype="float32", data=np.full(784, np.nan, "<f4").tobytes())),
            "non_finite",
            "784 of 784",
        ),
        (_sample(label=10), "label_out_of_range", "label 10, expected 0 … 9"),
        (_sample(label=-1), "label_out_of_range", "label -1"),
    ],
)
def test_each_rejection_reason(value: bytes | None, reason: str, detail: str) -> None:
    result = SampleDecoder(MNIST_SHAPE, 10).decode(value)
    assert isinstance(result, Rejection)
    assert result.reason == reason
    assert detail in result.detail


def test_non_finite_infinity_in_a_small_float_tensor() -> None:
    result = SampleDecoder((3,), 2).decode(_sample(tensor=_floats([0.0, float("inf"), 1.0])))
    assert result == Rejection("non_finite", "sample mnist/1: 1 of 3 values are NaN or infinite")


def test_a_label_may_be_absent_and_dtypes_may_be_restricted() -> None:
    assert valid(SampleDecoder(MNIST_SHAPE, 10).decode(_sample(label=None))).label is None
    restricted = SampleDecoder(MNIST_SHAPE, 10, allowed_dtypes=("float32",)).decode(_sample())
    assert isinstance(restricted, Rejection) and restricted.reason == "bad_dtype"


def test_decode_or_raise() -> None:
    decoder = SampleDecoder(MNIST_SHAPE, 10)
    assert decoder.decode_or_raise(_sample()).sample_id == "mnist/1"
    with pytest.raises(SampleRejectedError) as info:
        decoder.decode_or_raise(_sample(label=12))
    assert info.value.rejection.reason == "label_out_of_range"
    assert isinstance(info.value, ValueError)


def test_decoder_settings_are_checked() -> None:
    with pytest.raises(ConfigError):
        SampleDecoder(MNIST_SHAPE, 0)
    with pytest.raises(ConfigError):
        SampleDecoder(MNIST_SHAPE, 10, allowed_dtypes=("int8",))


def _trace_header() -> list[tuple[str, bytes | None]]:
    return [("trace", b"abc")]


@dataclass
class FakeRecord:
    """The parts of a confluent_kafka.Message that dead_letter reads."""

    raw: bytes | None
    topic_: str = "ferret.samples"
    partition_: int = 2
    offset_: int = 41
    headers_: list[tuple[str, bytes | None]] | None = field(default_factory=_trace_header)

    def topic(self) -> str | None:
        return self.topic_

    def partition(self) -> int | None:
        return self.partition_

    def offset(self) -> int | None:
        return self.offset_

    def value(self) -> bytes | None:
        return self.raw

    def headers(self) -> list[tuple[str, bytes | None]] | None:
        return self.headers_


def test_dead_letter_keeps_the_original_bytes_and_names_the_source() -> None:
    raw = _sample(label=99)
    record = FakeRecord(raw)
    rejection = SampleDecoder(MNIST_SHAPE, 10).decode(raw)
    assert isinstance(rejection, Rejection)
    value, headers = dead_letter(record, rejection, time_ms=1700000000000)
    assert value == raw  # byte for byte
    assert headers[0] == ("trace", b"abc")  # the record's own headers come first
    assert dead_letter_info(headers) == {
        "reason": "label_out_of_range",
        "detail": rejection.detail,
        "topic": "ferret.samples",
        "partition": "2",
        "offset": "41",
        "time_ms": "1700000000000",
    }


def test_dead_letter_of_a_tombstone_and_of_a_dead_letter() -> None:
    old: list[tuple[str, bytes | None]] = [("ferret.dlq.reason", b"old"), ("x", None)]
    record = FakeRecord(None, headers_=old)
    value, headers = dead_letter(record, Rejection("undecodable", "d" * 5000))
    assert value is None
    assert [k for k, _ in headers].count("ferret.dlq.reason") == 1  # replaced, not repeated
    assert ("x", b"") in headers
    info = dead_letter_info(headers)
    assert info["reason"] == "undecodable" and len(info["detail"]) == 1000


def test_an_image_of_another_size_is_resized_to_the_model_input_as_the_simulator_does() -> None:
    """Inputs match the plan: the trainer resizes (bilinear) where the simulator resizes."""
    x = np.arange(16 * 16, dtype=np.uint8).reshape(1, 16, 16)
    decoded = valid(SampleDecoder((1, 8, 8), 10).decode(encode_sample(x, stream="s", sequence=0).SerializeToString()))
    assert decoded.resized_from == (1, 16, 16)
    assert tuple(decoded.x.shape) == (1, 8, 8)
    expected = resize_images(normalise(x), (8, 8))
    assert torch.allclose(decoded.x, expected)
    same = valid(SampleDecoder((1, 16, 16), 10).decode(encode_sample(x, stream="s", sequence=0).SerializeToString()))
    assert same.resized_from is None


def test_another_channel_count_is_not_resized() -> None:
    x = np.zeros((3, 8, 8), np.uint8)
    result = SampleDecoder((1, 8, 8), 10).decode(encode_sample(x, stream="s", sequence=0).SerializeToString())
    assert isinstance(result, Rejection) and result.reason == "wrong_shape"
    assert "channel count" in result.detail


@pytest.mark.parametrize("normaliser", ["none", "clip", "minmax"])
@pytest.mark.parametrize("input_range", [(0.0, 1.0), (0.2, 0.8), (-1.0, 2.0)])
@pytest.mark.parametrize("dtype", ["uint8", "float32", "float64"])
def test_the_range_read_on_the_array_decides_as_the_tensor_does(
    dtype: str, input_range: tuple[float, float], normaliser: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The decoder reads a sample's bounds on the numpy array (no torch call on the record path): the same
    sample or rejection as reading them on the tensor (``_bounds`` → None)."""
    rng = np.random.default_rng(0)
    x = (rng.random((1, 8, 8)) * (255 if dtype == "uint8" else 1.3) - (0 if dtype == "uint8" else 0.1)).astype(dtype)
    raw = encode_sample(x, stream="s", sequence=0).SerializeToString()
    decoder = SampleDecoder((1, 8, 8), 10, input_range=input_range, normaliser=normaliser)  # type: ignore[arg-type]
    fast = decoder.decode(raw)
    monkeypatch.setattr(SampleDecoder, "_bounds", lambda self, array: None)
    slow = decoder.decode(raw)
    assert type(fast) is type(slow)
    if isinstance(fast, Rejection):
        assert isinstance(slow, Rejection) and fast.reason == slow.reason
    else:
        assert torch.equal(valid(fast).x, valid(slow).x)
