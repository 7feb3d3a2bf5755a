"""The trainer's model updates as a Redis stream that any number of serving processes follow.

Key: ``<redis.namespace>:models:{<instance id>}`` (one stream per trainer replica, like its snapshots).
Each update is the **full** weights (safetensors bytes of ``<unit>.<name>`` tensors) cut into entries of
at most ``chunk_bytes`` (default 8 MiB; a Redis value holds at most 512 MB), written in one MULTI, so a
reader sees an update whole or not at all. Fields of every entry::

    v   model version (optimizer updates applied)      n   chunk index     of   chunk count
    l   the lineage v counts along (ms; absent before lineages: 0, services.trainer.lineage)
    t   the trainer's update wall time (ms, the weights read from the master)
    p   the wall time the update was written (ms)      h   sha256 of the whole update's bytes
    c   the model card (JSON; chunk 0 only)             d   the chunk's bytes

The stream keeps the newest ``keep`` updates (``XADD MAXLEN`` exact, in entries). A follower that joins
late reads the newest complete update with one ``XREVRANGE`` and then blocks on ``XREAD`` from there:
no replay of history (docs/serving.md says why a Redis stream and not a Kafka topic, and why full weights).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import redis

from ferret_core.errors import ConfigError
from services.serving.errors import ModelStreamError
from services.serving.model_card import ModelCard

DEFAULT_CHUNK_BYTES = 8 * 2**20
MAX_CHUNK_BYTES = 512 * 2**20  # Redis's limit on one value
DEFAULT_KEEP = 3


def stream_key(namespace: str, instance_id: str) -> str:
    return f"{namespace}:models:{{{instance_id}}}"


@dataclass(frozen=True)
class ModelUpdate:
    """One published model: its version, the trainer's update time, the card and the weights' bytes."""

    version: int
    update_ms: int
    card: ModelCard
    data: bytes
    published_ms: int = 0
    entry_id: bytes = b""  # the stream id of its last chunk (where a follower goes on from)
    lineage: int = 0  # the lineage the version counts along


class ModelStreamWriter:
    """Appends updates to the stream (the trainer's publishing thread)."""

    def __init__(
        self, client: redis.Redis, key: str, *, chunk_bytes: int = DEFAULT_CHUNK_BYTES, keep: int = DEFAULT_KEEP
    ) -> None:
        if not 1 <= chunk_bytes <= MAX_CHUNK_BYTES:
            raise ConfigError(f"model stream chunk_bytes must be in 1..{MAX_CHUNK_BYTES}, got {chunk_bytes}")
        if keep < 1:
            raise ConfigError(f"the model stream keeps at least one update, got keep={keep}")
        self._redis = client
        self.key = key
        self.chunk_bytes = chunk_bytes
        self.keep = keep

    def publish(self, version: int, update_ms: int, card: ModelCard, data: bytes, lineage: int = 0) -> int:
        """Append one update (all its chunks in one MULTI); returns the bytes written (weights + card)."""
        chunks = [data[i : i + self.chunk_bytes] for i in range(0, len(data), self.chunk_bytes)] or [b""]
        digest = hashlib.sha256(data).hexdigest()
        card_json = json.dumps(card.to_dict(), sort_keys=True)
        published = time.time_ns() // 1_000_000
        pipe = self._redis.pipeline(transaction=True)
        for index, chunk in enumerate(chunks):
            fields: dict[str, bytes | str | int] = {
                "v": version, "l": lineage, "n": index, "of": len(chunks), "t": update_ms, "p": published,
                "h": digest, "d": chunk,
            }  # fmt: skip
            if index == 0:
                fields["c"] = card_json
            pipe.xadd(self.key, fields, maxlen=self.keep * len(chunks), approximate=False)  # type: ignore[arg-type]
        pipe.execute()
        return len(data) + len(card_json)


class ModelStreamReader:
    """Reads complete updates from the stream (a serving process's follower thread)."""

    def __init__(self, client: redis.Redis, key: str) -> None:
        if client.get_connection_kwargs().get("decode_responses"):
            raise ConfigError("the model stream needs a Redis client with decode_responses=False (bytes)")
        self._redis = client
        self.key = key

    def newest(self, scan: int = 256) -> ModelUpdate | None:
        """The newest complete update (None: none on the stream), from the last ``scan`` entries."""
        entries = cast(list[tuple[bytes, dict[bytes, bytes]]], self._redis.xrevrange(self.key, count=scan))
        complete = list(_assemble(reversed(entries)))
        return complete[-1] if complete else None

    def follow(self, after: bytes, block_ms: int) -> list[ModelUpdate]:
        """Complete updates written after stream id ``after`` (waits up to ``block_ms`` for the first)."""
        reply = cast(list[Any], self._redis.xread({self.key: after}, block=block_ms))
        if not reply:
            return []
        entries = cast(list[tuple[bytes, dict[bytes, bytes]]], reply[0][1])
        return list(_assemble(entries))


def _assemble(entries: Iterator[tuple[bytes, dict[bytes, bytes]]] | Sequence[tuple[bytes, dict[bytes, bytes]]]
              ) -> Iterator[ModelUpdate]:  # fmt: skip
    """Complete updates from entries in stream order; a partial update at the start (trimmed) is skipped."""
    parts: list[bytes] = []
    head: dict[bytes, bytes] | None = None
    for entry_id, fields in entries:
        try:
            index, count = int(fields[b"n"]), int(fields[b"of"])
        except (KeyError, ValueError):
            continue  # not an update entry
        if index == 0:
            head, parts = fields, []
        same = fields.get(b"v") == head.get(b"v") and fields.get(b"l") == head.get(b"l") if head else False
        if head is None or not same or index != len(parts):
            head, parts = None, []
            continue
        parts.append(fields.get(b"d", b""))
        if len(parts) == count:
            yield _update(head, b"".join(parts), entry_id)
            head, parts = None, []


def _update(head: dict[bytes, bytes], data: bytes, entry_id: bytes) -> ModelUpdate:
    try:
        if hashlib.sha256(data).hexdigest() != head[b"h"].decode():
            raise ValueError("the weights' sha256 differs from the update's")
        return ModelUpdate(
            version=int(head[b"v"]),
            update_ms=int(head[b"t"]),
            card=ModelCard.from_dict(json.loads(head[b"c"])),
            data=data,
            published_ms=int(head[b"p"]),
            entry_id=entry_id,
            lineage=int(head.get(b"l", b"0")),
        )
    except (KeyError, ValueError, UnicodeDecodeError) as exc:
        raise ModelStreamError(f"model update at stream id {entry_id!r} is corrupt: {exc}") from exc
