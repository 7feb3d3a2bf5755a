"""The ``Sample`` codec of ``<prefix>.samples`` and the trainer's validation of what it consumes
(DESIGN §4 "Kafka topics").

Producing: :class:`SampleEncoder` turns the items of one stream into serialized ``ferret.v1.Sample``
values (id ``<stream>/<sequence>``, raw little-endian tensor bytes with shape and dtype; ``uint8`` images
stay ``uint8``, so an MNIST item's tensor is 784 bytes). :func:`encode_sample` is the one-off form.

Consuming: :class:`SampleDecoder` checks a record's value and returns a :class:`ValidSample` (a float32
tensor normalised like :func:`ferret_core.data.normalise`: ``uint8`` / 255, floats as they are) or a
:class:`Rejection` with a stable reason code (:data:`REASONS`), checked in this order: ``undecodable``
(no value, or not a ``Sample``), ``too_large`` (the value exceeds ``max_record_bytes``, or the id or
stream name exceeds :data:`MAX_ID_BYTES`, so the Prediction keyed by it might not fit the producer's
message limit), ``missing_id``, ``missing_tensor``, ``bad_dtype`` (not one of :data:`ALLOWED_DTYPES`),
``bad_size`` (byte length ≠ product(shape) × itemsize, or a negative dimension), ``wrong_shape`` (≠ the
model's input shape; an image ``(C, H, W)`` with the model's C is resized bilinearly instead, as the
simulator resizes a dataset, and :attr:`ValidSample.resized_from` keeps its shape), ``non_finite`` (NaN
or ±inf), ``out_of_range`` (a finite value outside the input contract's range, after ``uint8`` scaling;
with the ``clip`` normaliser values are clamped instead, with ``minmax`` each sample is rescaled into
the range) and ``label_out_of_range`` (a label present and outside ``[0, num_classes)``).
The range exists because large finite inputs (float32 1e6,
±3e38, float16 65504) pass a NaN check and still drive the weights to NaN.

A rejected record goes to ``<prefix>.samples.dlq`` as :func:`dead_letter_record` builds it: the original
key, bytes and headers plus ``ferret.dlq.*`` headers naming the reason, detail, source topic, partition
and offset, all within ``max_bytes`` (the producer's message limit): a record too large to forward is
truncated (``ferret.dlq.truncated: true``, with the original size and sha256), so a dead letter can
always be written and a huge record can never crash-loop the trainer.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, get_args

import numpy as np
import torch
from google.protobuf.message import DecodeError

from ferret_core.data import RESIZE_METHOD, normalise
from ferret_core.data.stream import resize_images
from ferret_core.errors import ConfigError, FerretError
from services.proto_gen.ferret.v1.messages_pb2 import Sample, Tensor

log = logging.getLogger("ferret.codec")

RejectReason = Literal[
    "undecodable",
    "missing_id",
    "missing_tensor",
    "bad_dtype",
    "bad_size",
    "wrong_shape",
    "non_finite",
    "label_out_of_range",
    # (codes are only ever appended, never reordered)
    "too_large",
    "out_of_range",
]
REASONS: tuple[RejectReason, ...] = get_args(RejectReason)

# Element types a trainer accepts (little-endian); anything else is ``bad_dtype``.
ALLOWED_DTYPES: dict[str, np.dtype[np.generic]] = {
    "uint8": np.dtype("u1"),
    "float16": np.dtype("<f2"),
    "float32": np.dtype("<f4"),
    "float64": np.dtype("<f8"),
}
_FLOAT_DTYPES = frozenset({"float16", "float32", "float64"})
_DETAIL_LIMIT = 1000  # characters of a rejection's detail kept in the DLQ header

# The input contract's defaults: the finite range values must lie in (after uint8 → [0, 1] scaling) and
# the longest sample id / stream name (both are copied into the Prediction, the id is also its key).
DEFAULT_INPUT_RANGE = (-1000.0, 1000.0)
MAX_ID_BYTES = 1024
RECORD_SLACK_BYTES = 64 * 1024  # a Sample's bytes beyond its tensor: id, stream, numbers, framing
# librdkafka's default message.max.bytes; a dead letter (key + value + headers) stays below it.
DEFAULT_MESSAGE_LIMIT = 1_000_000
Normaliser = Literal["none", "clip", "minmax"]
NORMALISERS: tuple[Normaliser, ...] = get_args(Normaliser)

# Headers of a dead letter (values are UTF-8 text; partition, offset and times in decimal).
DLQ_REASON = "ferret.dlq.reason"
DLQ_DETAIL = "ferret.dlq.detail"
DLQ_TOPIC = "ferret.dlq.topic"
DLQ_PARTITION = "ferret.dlq.partition"
DLQ_OFFSET = "ferret.dlq.offset"
DLQ_TIME_MS = "ferret.dlq.time_ms"
DLQ_TRUNCATED = "ferret.dlq.truncated"  # "true" when the value (or key, headers) was cut to fit
DLQ_ORIGINAL_BYTES = "ferret.dlq.original_bytes"
DLQ_ORIGINAL_SHA256 = "ferret.dlq.original_sha256"
DLQ_HEADERS = (
    DLQ_REASON,
    DLQ_DETAIL,
    DLQ_TOPIC,
    DLQ_PARTITION,
    DLQ_OFFSET,
    DLQ_TIME_MS,
    DLQ_TRUNCATED,
    DLQ_ORIGINAL_BYTES,
    DLQ_ORIGINAL_SHA256,
)


def sample_id(stream: str, sequence: int) -> str:
    """The id of item ``sequence`` of ``stream``: ``"<stream>/<sequence>"`` (the record key too)."""
    return f"{stream}/{sequence}"


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def _dtype_name(x: np.ndarray) -> str:
    name = x.dtype.name
    if name not in ALLOWED_DTYPES:
        raise ConfigError(f"cannot encode a {name} tensor: expected one of {', '.join(ALLOWED_DTYPES)}")
    return name


class SampleEncoder:
    """Serializes the items of one stream (fixed shape and dtype), reusing one message (~2 µs per item).

    Not thread-safe: use one per producing thread.
    """

    def __init__(self, stream: str, shape: Sequence[int], dtype: str) -> None:
        if dtype not in ALLOWED_DTYPES:
            raise ConfigError(f"cannot encode dtype {dtype!r}: expected one of {', '.join(ALLOWED_DTYPES)}")
        if not stream:
            raise ConfigError("the stream name must not be empty (e.g. the dataset name, mnist)")
        self.stream = stream
        self.shape = tuple(int(s) for s in shape)
        self.dtype = dtype
        self.nbytes = math.prod(self.shape) * ALLOWED_DTYPES[dtype].itemsize
        self._message = Sample(stream=stream, tensor=Tensor(shape=self.shape, dtype=dtype))

    def encode(
        self, data: bytes, sequence: int, *, label: int | None = None, task: int = 0, event_time_ms: int | None = None
    ) -> tuple[str, bytes]:
        """``(id, serialized Sample)`` for one item's raw tensor ``data`` (``x.tobytes()``, C order)."""
        if len(data) != self.nbytes:
            raise ConfigError(
                f"item {sequence} of {self.stream} has {len(data)} tensor bytes, expected {self.nbytes} "
                f"(shape {list(self.shape)}, {self.dtype})"
            )
        message = self._message
        ident = f"{self.stream}/{sequence}"
        message.id = ident
        message.sequence = sequence
        message.event_time_ms = now_ms() if event_time_ms is None else event_time_ms
        message.task = task
        message.tensor.data = data
        if label is None:
            message.ClearField("label")
        else:
            message.label = label
        return ident, message.SerializeToString()


def encode_sample(
    x: np.ndarray,
    *,
    stream: str,
    sequence: int,
    label: int | None = None,
    task: int = 0,
    event_time_ms: int | None = None,
) -> Sample:
    """One dataset item as a ``Sample`` (``x`` keeps its dtype: ``uint8`` images stay ``uint8``)."""
    array = np.ascontiguousarray(x)
    dtype = _dtype_name(array)
    data = array.astype(ALLOWED_DTYPES[dtype], copy=False).tobytes()
    sample = Sample(
        id=sample_id(stream, sequence),
        sequence=sequence,
        event_time_ms=now_ms() if event_time_ms is None else event_time_ms,
        stream=stream,
        task=task,
        tensor=Tensor(shape=array.shape, dtype=dtype, data=data),
    )
    if label is not None:
        sample.label = label
    return sample


@dataclass(frozen=True)
class Rejection:
    """Why a record is not a valid sample: a stable ``reason`` code and a human ``detail``."""

    reason: RejectReason
    detail: str


class SampleRejectedError(FerretError, ValueError):
    """Raised by :meth:`SampleDecoder.decode_or_raise`; carries the :class:`Rejection`."""

    def __init__(self, rejection: Rejection) -> None:
        super().__init__(f"{rejection.reason}: {rejection.detail}")
        self.rejection = rejection


@dataclass(frozen=True, eq=False)
class ValidSample:
    """A decoded, validated item: ``x`` is float32 of the model's input shape, normalised."""

    sample_id: str
    sequence: int
    event_time_ms: int
    x: torch.Tensor
    label: int | None
    task: int
    stream: str
    resized_from: tuple[int, ...] | None = None  # the sample's own shape when it was resized to the model's


class SampleDecoder:
    """Validates consumed ``Sample`` values against the model's input contract: ``input_shape``,
    ``num_classes``, ``allowed_dtypes``, the finite ``input_range`` (after ``uint8`` scaling) and what to
    do with values outside it (``normaliser``: ``none`` rejects them ``out_of_range``, ``clip`` clamps
    them, ``minmax`` rescales each sample into the range). ``max_record_bytes`` (default: the largest
    valid Sample's tensor plus :data:`RECORD_SLACK_BYTES`) bounds what is parsed at all."""

    def __init__(
        self,
        input_shape: Sequence[int],
        num_classes: int,
        *,
        allowed_dtypes: Sequence[str] = tuple(ALLOWED_DTYPES),
        input_range: tuple[float, float] = DEFAULT_INPUT_RANGE,
        normaliser: Normaliser = "none",
        max_record_bytes: int | None = None,
    ) -> None:
        unknown = [d for d in allowed_dtypes if d not in ALLOWED_DTYPES]
        if unknown or not allowed_dtypes:
            raise ConfigError(f"allowed dtypes must be a non-empty subset of {list(ALLOWED_DTYPES)}, got {unknown}")
        if num_classes < 1 or any(s < 0 for s in input_shape):
            raise ConfigError(f"need num_classes >= 1 and sizes >= 0, got {num_classes} and {list(input_shape)}")
        low, high = (float(v) for v in input_range)
        if not (math.isfinite(low) and math.isfinite(high) and low < high):
            raise ConfigError(f"input_range must be two finite numbers [low, high] with low < high, got {input_range}")
        if normaliser not in NORMALISERS:
            raise ConfigError(f"normaliser must be one of {', '.join(NORMALISERS)}, got {normaliser!r}")
        self.input_shape = tuple(int(s) for s in input_shape)
        self.num_classes = int(num_classes)
        self.allowed_dtypes = tuple(allowed_dtypes)
        self.input_range = (low, high)
        self.normaliser = normaliser
        largest = math.prod(self.input_shape) * max(ALLOWED_DTYPES[d].itemsize for d in self.allowed_dtypes)
        self.max_record_bytes = max_record_bytes if max_record_bytes is not None else largest + RECORD_SLACK_BYTES
        if self.max_record_bytes < 1:
            raise ConfigError(f"max_record_bytes must be >= 1, got {self.max_record_bytes}")
        self._resized_shapes: set[tuple[int, ...]] = set()

    def decode(self, value: bytes | None) -> ValidSample | Rejection:
        """The sample in ``value``, or why it is rejected (never raises for bad input)."""
        if value is None:
            return Rejection("undecodable", "the record has no value (a tombstone)")
        if len(value) > self.max_record_bytes:
            return Rejection(
                "too_large",
                f"the record has {len(value)} bytes, more than the {self.max_record_bytes} a sample of shape "
                f"{list(self.input_shape)} can take",
            )
        try:
            sample = Sample.FromString(value)
        except (DecodeError, RuntimeWarning) as exc:
            return Rejection("undecodable", f"not a ferret.v1.Sample ({len(value)} bytes): {exc}")
        for what, text in (("id", sample.id), ("stream name", sample.stream)):
            if len(text.encode("utf-8")) > MAX_ID_BYTES:
                return Rejection(
                    "too_large",
                    f"the sample's {what} has {len(text.encode('utf-8'))} bytes, more than {MAX_ID_BYTES} (it is "
                    "copied into the Prediction and its key)",
                )
        if not sample.id:
            return Rejection("missing_id", f"sample {sample.stream or '?'}/{sample.sequence} has an empty id")
        if not sample.HasField("tensor"):
            return Rejection("missing_tensor", f"sample {sample.id} has no tensor")
        tensor = sample.tensor
        if tensor.dtype not in self.allowed_dtypes:
            return Rejection(
                "bad_dtype",
                f"sample {sample.id}: dtype {tensor.dtype!r}, expected one of {', '.join(self.allowed_dtypes)}",
            )
        shape = tuple(tensor.shape)
        if any(s < 0 for s in shape):
            return Rejection("bad_size", f"sample {sample.id}: shape {list(shape)} has a negative dimension")
        dtype = ALLOWED_DTYPES[tensor.dtype]
        expected_bytes = math.prod(shape) * dtype.itemsize
        if len(tensor.data) != expected_bytes:
            return Rejection(
                "bad_size",
                f"sample {sample.id}: {len(tensor.data)} data bytes, expected {expected_bytes} for shape "
                f"{list(shape)} of {tensor.dtype}",
            )
        if shape != self.input_shape and not self._resizable(shape):
            return Rejection(
                "wrong_shape",
                f"sample {sample.id}: shape {list(shape)}, the model expects {list(self.input_shape)} (only images "
                "with the model's channel count are resized)",
            )
        array = np.frombuffer(bytearray(tensor.data), dtype=dtype).reshape(shape)
        if tensor.dtype in _FLOAT_DTYPES:
            finite = np.isfinite(array)
            if not finite.all():
                bad = int(array.size - np.count_nonzero(finite))
                return Rejection("non_finite", f"sample {sample.id}: {bad} of {array.size} values are NaN or infinite")
            array = array.astype(np.float32, copy=False)
        bounds = self._bounds(array)  # read on the array: no torch call on the record path's thread
        x = normalise(array)
        resized_from = None
        if shape != self.input_shape:  # an image of another size: resized as the simulator does
            x = resize_images(x, (self.input_shape[1], self.input_shape[2]))
            bounds = None  # the resized values' own (bilinear stays within the source's, but read them)
            resized_from = shape
            if shape not in self._resized_shapes:
                self._resized_shapes.add(shape)
                log.info(
                    "samples of shape %s are resized (%s) to the model's input %s",
                    list(shape),
                    RESIZE_METHOD,
                    list(self.input_shape),
                )
        out_of_range = self._apply_range(x, sample.id, bounds)
        if out_of_range is not None:
            return out_of_range
        label: int | None = None
        if sample.HasField("label"):
            label = int(sample.label)
            if not 0 <= label < self.num_classes:
                return Rejection(
                    "label_out_of_range", f"sample {sample.id}: label {label}, expected 0 … {self.num_classes - 1}"
                )
        return ValidSample(
            sample_id=sample.id,
            sequence=int(sample.sequence),
            event_time_ms=int(sample.event_time_ms),
            x=x,
            label=label,
            task=int(sample.task),
            stream=sample.stream,
            resized_from=resized_from,
        )

    def _resizable(self, shape: tuple[int, ...]) -> bool:
        """Whether a sample of ``shape`` is an image the decoder resizes to the model's input: both are
        ``(C, H, W)`` with the same C and non-empty sides (bilinear)."""
        want = self.input_shape
        return len(shape) == len(want) == 3 and shape[0] == want[0] and min(shape) > 0 and min(want) > 0

    def _bounds(self, array: np.ndarray) -> tuple[float, float] | None:
        """The smallest and largest value ``x`` will hold after :func:`normalise`, read on the (float32 or
        uint8) array without a torch call; ``None`` when empty. uint8 is scaled into [0, 1], so (0, 1) bounds
        it whenever the input range holds [0, 1] (the default); otherwise its values are read after scaling."""
        if array.size == 0:
            return None
        if array.dtype == np.uint8:
            low, high = self.input_range
            return (0.0, 1.0) if low <= 0.0 and high >= 1.0 else None
        return float(array.min()), float(array.max())

    def _apply_range(
        self, x: torch.Tensor, ident: str, bounds: tuple[float, float] | None = None
    ) -> Rejection | None:
        """Check (``none``), clamp (``clip``) or rescale (``minmax``) ``x`` in place into the input range;
        ``bounds``: ``x``'s smallest and largest value or bounds on them, when the caller knows them
        (:meth:`_bounds`); read from ``x`` otherwise and wherever they are out of range."""
        low, high = self.input_range
        if x.numel() == 0:
            return None
        if bounds is not None and low <= bounds[0] and bounds[1] <= high:
            return None
        smallest, largest = float(x.min()), float(x.max())
        if low <= smallest and largest <= high:
            return None
        if self.normaliser == "clip":
            x.clamp_(low, high)
        elif self.normaliser == "minmax":
            span = largest - smallest
            if span > 0 and math.isfinite(span):
                # in float64: x − min overflows float32 when the values span beyond its largest finite
                x.copy_((x.double() - smallest) / span * (high - low) + low)
            else:  # one repeated value, or a span beyond float32: fall back to clamping
                x.clamp_(low, high)
        else:
            return Rejection(
                "out_of_range",
                f"sample {ident}: values span [{smallest:.6g}, {largest:.6g}], the input range is "
                f"[{low:g}, {high:g}] (trainer.input_range; trainer.input_normaliser clip or minmax accepts them)",
            )
        return None

    def decode_or_raise(self, value: bytes | None) -> ValidSample:
        """Like :meth:`decode`, raising :class:`SampleRejectedError` for a rejected value."""
        result = self.decode(value)
        if isinstance(result, Rejection):
            raise SampleRejectedError(result)
        return result


class KafkaRecord(Protocol):
    """What :func:`dead_letter` reads of a consumed record (``confluent_kafka.Message`` has it)."""

    def topic(self) -> str | None: ...
    def partition(self) -> int | None: ...
    def offset(self) -> int | None: ...
    def value(self) -> bytes | None: ...
    def headers(self) -> list[tuple[str, str | bytes | None]] | dict[str, str | bytes | None] | None: ...


Headers = list[tuple[str, bytes]]


@dataclass(frozen=True)
class DeadLetter:
    """The DLQ record for a rejected record: produce ``value`` with ``key`` and ``headers``."""

    key: bytes | None
    value: bytes | None
    headers: Headers
    truncated: bool


_HEADER_OVERHEAD = 64  # bytes per record and per header beyond their names and values (framing)


def dead_letter_record(
    record: KafkaRecord, rejection: Rejection, *, max_bytes: int = DEFAULT_MESSAGE_LIMIT, time_ms: int | None = None
) -> DeadLetter:
    """The DLQ record for ``record`` within ``max_bytes`` (key + value + headers; the producer's
    ``message.max.bytes``): the original key, value and headers (other than ``ferret.dlq.*``) plus ours.
    What does not fit is cut, original headers first dropped, then key and value truncated; a cut record
    says so in ``ferret.dlq.truncated`` with the original value's size and sha256."""
    key_getter = getattr(record, "key", None)
    key = key_getter() if callable(key_getter) else None
    value = record.value()
    ours = {
        DLQ_REASON: rejection.reason,
        DLQ_DETAIL: rejection.detail[:_DETAIL_LIMIT],
        DLQ_TOPIC: (record.topic() or "")[:256],
        DLQ_PARTITION: str(record.partition()),
        DLQ_OFFSET: str(record.offset()),
        DLQ_TIME_MS: str(now_ms() if time_ms is None else time_ms),
    }
    received = record.headers() or []
    pairs = received.items() if isinstance(received, dict) else received  # confluent-kafka gives either
    original = [
        (k, b"" if v is None else v.encode() if isinstance(v, str) else v)
        for k, v in pairs
        if not k.startswith("ferret.dlq.")
    ]

    def size(headers: Headers, key: bytes | None, value: bytes | None) -> int:
        fields = sum(len(k.encode()) + len(v) + _HEADER_OVERHEAD for k, v in headers)
        return _HEADER_OVERHEAD + len(key or b"") + len(value or b"") + fields

    encoded = [(k, v.encode("utf-8")) for k, v in ours.items()]
    if size(original + encoded, key, value) <= max_bytes:
        return DeadLetter(key, value, original + encoded, truncated=False)
    extra = {
        DLQ_TRUNCATED: "true",
        DLQ_ORIGINAL_BYTES: str(len(value or b"")),
        DLQ_ORIGINAL_SHA256: hashlib.sha256(value or b"").hexdigest(),
    }
    encoded += [(k, v.encode("utf-8")) for k, v in extra.items()]
    kept: Headers = []
    used = size(encoded, None, None)
    for name, data in original:  # keep the original headers that fit in half the limit, in order
        cost = len(name.encode()) + len(data) + _HEADER_OVERHEAD
        if used + cost <= max_bytes // 2:
            kept.append((name, data))
            used += cost
    headers = kept + encoded
    key = None if key is None else key[: min(len(key), MAX_ID_BYTES)]
    room = max(0, max_bytes - size(headers, key, b""))
    return DeadLetter(key, None if value is None else value[:room], headers, truncated=True)


def dead_letter(
    record: KafkaRecord, rejection: Rejection, *, time_ms: int | None = None, max_bytes: int = DEFAULT_MESSAGE_LIMIT
) -> tuple[bytes | None, Headers]:
    """``(value, headers)`` of :func:`dead_letter_record` (produce it with the record's key, which
    :func:`dead_letter_record` also bounds: prefer that one)."""
    letter = dead_letter_record(record, rejection, max_bytes=max_bytes, time_ms=time_ms)
    return letter.value, letter.headers


def dead_letter_info(headers: Sequence[tuple[str, bytes | None]] | None) -> dict[str, str]:
    """The ``ferret.dlq.*`` headers of a DLQ message as text, keyed without the prefix (``reason``, …)."""
    out: dict[str, str] = {}
    for key, value in headers or []:
        if key in DLQ_HEADERS:
            out[key.removeprefix("ferret.dlq.")] = (value or b"").decode("utf-8", errors="replace")
    return out
