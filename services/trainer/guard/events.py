"""What the guard tells the world: :class:`ModelEvent` values (a rollback, a promotion, a drift), queued by
the learner and published by the record path to ``<prefix>.events`` as ``ferret.v1.ModelEvent``, with the
stream position of the item that decided them (docs/reliability.md "Guarded updates", "Drift")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from services.proto_gen.ferret.v1 import messages_pb2

EventKind = Literal["rollback", "promotion", "drift"]
HEADERS = [("content-type", b"application/x-protobuf; messageType=ferret.v1.ModelEvent")]


@dataclass(frozen=True, slots=True)
class ModelEvent:
    """One event. ``model_version``: in force after it; ``previous_model_version``: the live model's before
    a rollback or promotion (-1: not applicable); ``item``: the trainer's counter i of the deciding item."""

    kind: EventKind
    model_version: int
    item: int
    time_ms: int
    previous_model_version: int = -1
    detector: str = ""
    reaction: str = "none"
    detail: str = ""
    model_lineage: int = 0  # the lineage model_version counts along (a rollback begins a new one)


def event_message(event: ModelEvent, *, instance_id: str, partition: int, offset: int) -> messages_pb2.ModelEvent:
    """The record on ``<prefix>.events``; ``partition``/``offset``: where the item's sample was read
    (-1 when no longer known)."""
    return messages_pb2.ModelEvent(
        kind=event.kind,
        instance_id=instance_id,
        model_version=event.model_version,
        previous_model_version=event.previous_model_version,
        item=event.item,
        source_partition=partition,
        source_offset=offset,
        detector=event.detector,
        reaction=event.reaction,
        detail=event.detail,
        time_ms=event.time_ms,
        model_lineage=event.model_lineage,
    )
