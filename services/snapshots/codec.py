"""Snapshot bytes: tensors ↔ bytes, chunking, checksums and the manifest (no Redis here).

Tensors are written with ``torch.save`` and read with ``torch.load(weights_only=True)``, which accepts
tensors and plain containers only and never runs code from the bytes it reads.

Signing: with a key, the manifest carries ``"hmac"``: HMAC-SHA256 over the canonical JSON (sorted keys,
no spaces) of every other field: offsets, checksums, plan, tensors, counters. Whoever can write Redis but
lacks the key cannot forge offsets or swap chunks (the chunk checksums are signed) unnoticed.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import torch

from services.snapshots.errors import SnapshotCorruptError

FORMAT = 1


@dataclass(frozen=True)
class SnapshotPayload:
    """What a snapshot holds.

    ``tensors``: model, optimizer and compensator tensors under flattened names (e.g.
    ``model.0.weight``, ``optim.state.3.exp_avg``, ``comp.fisher.0``). ``plan``: ``Plan.to_dict()``.
    ``offsets``: per topic and partition, the first offset whose work the weights do not yet reflect.
    ``counters``: online-accuracy and stream counters. ``compensator``: a small JSON summary of the
    compensator state (its name, decay, step counts); its tensors go in ``tensors``. ``meta``: anything
    else JSON can hold. ``version`` is set by ``SnapshotStore.load`` and ignored by ``save``.
    """

    tensors: Mapping[str, torch.Tensor] = field(default_factory=dict)
    plan: Mapping[str, Any] = field(default_factory=dict)
    offsets: Mapping[str, Mapping[int, int]] = field(default_factory=dict)
    counters: Mapping[str, float | int] = field(default_factory=dict)
    compensator: Mapping[str, Any] = field(default_factory=dict)
    meta: Mapping[str, Any] = field(default_factory=dict)
    version: int | None = None


@dataclass(frozen=True)
class ChunkInfo:
    index: int
    size: int
    sha256: str


@dataclass(frozen=True)
class SnapshotManifest:
    """The JSON document stored next to a version's chunks."""

    version: int
    instance_id: str
    created_time_ms: int
    chunks: tuple[ChunkInfo, ...]
    total_bytes: int
    sha256: str
    tensors: Mapping[str, Mapping[str, Any]]  # name → {"shape": [...], "dtype": "float32"}
    plan: Mapping[str, Any]
    offsets: Mapping[str, Mapping[int, int]]
    counters: Mapping[str, float | int]
    compensator: Mapping[str, Any]
    meta: Mapping[str, Any]

    @property
    def created_at(self) -> str:
        return datetime.fromtimestamp(self.created_time_ms / 1000, tz=UTC).isoformat()

    def to_json(self, key: bytes | None = None) -> bytes:
        """The manifest document; with ``key``, signed (module docstring)."""
        document: dict[str, Any] = {
            "format": FORMAT,
            "version": self.version,
            "instance_id": self.instance_id,
            "created_time_ms": self.created_time_ms,
            "created_at": self.created_at,
            "chunk_count": len(self.chunks),
            "chunks": [{"index": c.index, "size": c.size, "sha256": c.sha256} for c in self.chunks],
            "total_bytes": self.total_bytes,
            "sha256": self.sha256,
            "tensors": {k: dict(v) for k, v in self.tensors.items()},
            "plan": dict(self.plan),
            "offsets": {t: {str(p): int(o) for p, o in parts.items()} for t, parts in self.offsets.items()},
            "counters": dict(self.counters),
            "compensator": dict(self.compensator),
            "meta": dict(self.meta),
        }
        if key is not None:
            document[SIGNATURE_FIELD] = signature(document, key)
        return json.dumps(document, sort_keys=True, allow_nan=False).encode()

    @classmethod
    def from_json(cls, raw: bytes, key: bytes | None = None) -> SnapshotManifest:
        """Parse (and with ``key`` verify the signature of) a manifest; :class:`SnapshotCorruptError` when
        it is malformed, unsigned or its signature differs."""
        try:
            doc = json.loads(raw)
            if not isinstance(doc, dict):
                raise ValueError(f"a JSON object was expected, got {type(doc).__name__}")
            if key is not None:
                _verify(doc, key)
            if doc.get("format") != FORMAT:
                raise ValueError(f"format {doc.get('format')!r}, expected {FORMAT}")
            chunks = tuple(
                ChunkInfo(index=int(c["index"]), size=int(c["size"]), sha256=str(c["sha256"])) for c in doc["chunks"]
            )
            if int(doc["chunk_count"]) != len(chunks) or [c.index for c in chunks] != list(range(len(chunks))):
                raise ValueError("chunk list does not match chunk_count")
            return cls(
                version=int(doc["version"]),
                instance_id=str(doc["instance_id"]),
                created_time_ms=int(doc["created_time_ms"]),
                chunks=chunks,
                total_bytes=int(doc["total_bytes"]),
                sha256=str(doc["sha256"]),
                tensors=dict(doc["tensors"]),
                plan=dict(doc["plan"]),
                offsets={str(t): {int(p): int(o) for p, o in parts.items()} for t, parts in doc["offsets"].items()},
                counters=dict(doc["counters"]),
                compensator=dict(doc["compensator"]),
                meta=dict(doc["meta"]),
            )
        except SnapshotCorruptError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise SnapshotCorruptError(f"snapshot manifest is malformed: {exc}") from exc


SIGNATURE_FIELD = "hmac"


def _canonical(document: dict[str, Any]) -> bytes:
    unsigned = {k: v for k, v in document.items() if k != SIGNATURE_FIELD}
    return json.dumps(unsigned, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def signature(document: dict[str, Any], key: bytes) -> str:
    """HMAC-SHA256 (hex) of the document without its signature field."""
    return hmac.new(key, _canonical(document), hashlib.sha256).hexdigest()


def _verify(document: dict[str, Any], key: bytes) -> None:
    given = document.get(SIGNATURE_FIELD)
    if not isinstance(given, str):
        raise SnapshotCorruptError("snapshot manifest is unsigned, but a signing key is configured")
    if not hmac.compare_digest(given, signature(document, key)):
        raise SnapshotCorruptError("snapshot manifest signature does not match (forged or another key)")


def non_finite(tensors: Mapping[str, torch.Tensor]) -> list[str]:
    """Names of the floating-point tensors holding NaN or ±inf (a snapshot never holds them)."""
    return [
        name
        for name, t in tensors.items()
        if isinstance(t, torch.Tensor)
        and (t.is_floating_point() or t.is_complex())
        and not bool(torch.isfinite(t).all())
    ]


def _plain(tensor: torch.Tensor) -> torch.Tensor:
    """A detached CPU tensor that owns exactly its elements (``torch.save`` of a view writes the whole
    storage it views)."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"snapshot tensors must be torch.Tensor, got {type(tensor).__name__}")
    out = tensor.detach().cpu()
    if out.is_sparse or out.layout != torch.strided:
        return out
    if not out.is_contiguous() or out.untyped_storage().nbytes() != out.numel() * out.element_size():
        out = out.contiguous().clone()
    return out


def encode_tensors(tensors: Mapping[str, torch.Tensor]) -> bytes:
    """``torch.save`` of a ``{name: tensor}`` dict (CPU, detached, compact)."""
    plain: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"snapshot tensor names must be non-empty strings, got {name!r}")
        plain[name] = _plain(tensor)
    buffer = io.BytesIO()
    torch.save(plain, buffer)
    return buffer.getvalue()


def decode_tensors(data: bytes) -> dict[str, torch.Tensor]:
    """Inverse of :func:`encode_tensors`; refuses anything but a dict of tensors (weights_only)."""
    try:
        loaded = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises UnpicklingError, RuntimeError, ... for foreign content
        raise SnapshotCorruptError(f"snapshot tensors cannot be read safely: {exc}") from exc
    if not isinstance(loaded, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in loaded.items()
    ):
        raise SnapshotCorruptError("snapshot tensors are not a {name: tensor} dict")
    return loaded


def split(data: bytes, chunk_bytes: int) -> Iterator[memoryview]:
    """Consecutive slices of at most ``chunk_bytes`` (one empty chunk for empty data)."""
    view = memoryview(data)
    if not data:
        yield view
        return
    for start in range(0, len(data), chunk_bytes):
        yield view[start : start + chunk_bytes]


def sha256_hex(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def tensor_summary(tensors: Mapping[str, torch.Tensor]) -> dict[str, dict[str, Any]]:
    return {name: {"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")} for name, t in tensors.items()}


def now_ms() -> int:
    return time.time_ns() // 1_000_000
