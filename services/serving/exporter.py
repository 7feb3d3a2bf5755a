"""A snapshot version as ``ferret export``'s files (:mod:`.export_files`): from the trainer's snapshot
store in Redis (the newest valid version by default), verified as a restore verifies it (chunk checksums,
the signature with ``redis.hmac_key``, finite tensors). ``torch_export`` also writes the model as a
``torch.export`` program (``model.pt2``); a model torch.export refuses fails the export before anything
is written, naming the model and torch's reason.

The model card comes from the snapshot (``meta.model_card``, written by trainers since the export
existed); for an older snapshot, from the settings the trainer ran with (``trainer.model``,
``input_shape``, ``num_classes``, the input contract), and the rebuilt model must then load the weights
strictly or the export fails.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from services.serving.errors import ExportError
from services.serving.export_files import (
    ExportManifest,
    TorchExportFile,
    encode_weights,
    load_export,
    onnx_bytes,
    sha256_hex,
    torch_export_bytes,
    write_export,
)
from services.serving.model_card import ModelCard, model_lineage, model_version, rebuild, unit_weights
from services.snapshots import SnapshotPayload, SnapshotStore

log = logging.getLogger("ferret.export")

CARD_META = "model_card"  # the snapshot meta key of the model card


@dataclass(frozen=True)
class ExportResult:
    directory: Path
    manifest: ExportManifest


def card_of(payload: SnapshotPayload, fallback: ModelCard | None) -> ModelCard:
    """The snapshot's model card, else ``fallback`` (the settings'), else an error saying what to pass."""
    stored = payload.meta.get(CARD_META)
    if isinstance(stored, dict):
        return ModelCard.from_dict(stored)
    if fallback is None:
        raise ExportError(
            f"snapshot v{payload.version} has no model card (written before exports existed); pass the trainer's "
            "--config (trainer.model, trainer.input_shape / num_classes or trainer.dataset)"
        )
    log.warning("snapshot v%s has no model card: using the settings' (%s)", payload.version, fallback.model)
    return fallback


def export_snapshot(
    store: SnapshotStore,
    out: Path,
    *,
    version: int | None = None,
    fallback_card: ModelCard | None = None,
    onnx: bool = False,
    torch_export: bool = False,
) -> ExportResult:
    """Export snapshot ``version`` (None: the newest valid one) of ``store`` into ``out``; the written
    directory is read back with :func:`load_export` before returning (a broken export fails here)."""
    payload = store.load(version) if version is not None else store.load_latest_valid()
    card = card_of(payload, fallback_card)
    weights = unit_weights(payload.tensors)
    model = rebuild(card, weights)  # the weights fit the card, or ExportError
    data = encode_weights(weights)
    program = torch_export_bytes(model, card) if torch_export else None  # refused: nothing written
    onnx_data = onnx_bytes(model, card) if onnx else None
    manifest = ExportManifest(
        card=card,
        model_version=model_version(payload.tensors),
        model_lineage=model_lineage(payload.tensors),
        sha256=sha256_hex(data),
        weights_bytes=len(data),
        plan=payload.plan,
        offsets=payload.offsets,
        snapshot_version=payload.version,
        instance_id=str(payload.meta.get("instance_id", store.instance_id)),
        created_time_ms=time.time_ns() // 1_000_000,
        onnx=onnx,
        torch_export=None if program is None else TorchExportFile.of(program),
    )
    write_export(out, manifest, data, onnx_data, program)
    load_export(out)
    return ExportResult(out, manifest)
