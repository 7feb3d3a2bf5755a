"""``ferret export``'s files and their loader: a directory with

    model.safetensors   the units' tensors under ``<unit>.<name>`` (``nn.Sequential`` state-dict keys),
                        safetensors: no pickle, readable from Rust, C++, JavaScript, NumPy
    manifest.json       format, the model card (spec, input shape, classes, input contract), the model
                        version, the plan, the stream offsets the weights cover, the snapshot version and
                        instance it came from, and the sha256 of model.safetensors
    model.onnx          optional (``--onnx``), where torch.onnx can export the model here

:func:`load_export` checks the checksum and rebuilds the model from the card alone: no Redis, Kafka or
trainer. The manifest is written last, so a directory without one is an interrupted export.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors
from torch import nn

from services.serving.errors import ExportError
from services.serving.model_card import ModelCard, rebuild

EXPORT_FORMAT = 1
WEIGHTS_FILE = "model.safetensors"
MANIFEST_FILE = "manifest.json"
ONNX_FILE = "model.onnx"


@dataclass(frozen=True)
class ExportManifest:
    """``manifest.json`` (module docstring). ``offsets``: per topic and partition, the first offset whose
    work the weights do not reflect (the snapshot's)."""

    card: ModelCard
    model_version: int
    sha256: str
    weights_bytes: int
    plan: Mapping[str, Any] = field(default_factory=dict)
    offsets: Mapping[str, Mapping[int, int]] = field(default_factory=dict)
    snapshot_version: int | None = None
    instance_id: str = ""
    created_time_ms: int = 0
    onnx: bool = False

    def to_json(self) -> str:
        document = {
            "format": EXPORT_FORMAT,
            "weights": WEIGHTS_FILE,
            "sha256": self.sha256,
            "weights_bytes": self.weights_bytes,
            "card": self.card.to_dict(),
            "model_version": self.model_version,
            "plan": dict(self.plan),
            "offsets": {t: {str(p): int(o) for p, o in parts.items()} for t, parts in self.offsets.items()},
            "snapshot_version": self.snapshot_version,
            "instance_id": self.instance_id,
            "created_time_ms": self.created_time_ms,
            "onnx": ONNX_FILE if self.onnx else None,
        }
        return json.dumps(document, indent=2, sort_keys=True, allow_nan=False) + "\n"

    @classmethod
    def from_json(cls, text: str, where: str) -> ExportManifest:
        try:
            doc = json.loads(text)
            if doc.get("format") != EXPORT_FORMAT:
                raise ValueError(f"format {doc.get('format')!r}, expected {EXPORT_FORMAT}")
            return cls(
                card=ModelCard.from_dict(doc["card"]),
                model_version=int(doc["model_version"]),
                sha256=str(doc["sha256"]),
                weights_bytes=int(doc["weights_bytes"]),
                plan=dict(doc.get("plan") or {}),
                offsets={str(t): {int(p): int(o) for p, o in v.items()} for t, v in (doc.get("offsets") or {}).items()},
                snapshot_version=None if doc.get("snapshot_version") is None else int(doc["snapshot_version"]),
                instance_id=str(doc.get("instance_id", "")),
                created_time_ms=int(doc.get("created_time_ms", 0)),
                onnx=bool(doc.get("onnx")),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ExportError(f"{where} is not a Ferret export manifest: {exc}") from exc


@dataclass(frozen=True)
class LoadedModel:
    """An export read back: the rebuilt model (eval mode) and its manifest."""

    model: nn.Sequential
    manifest: ExportManifest

    @property
    def card(self) -> ModelCard:
        return self.manifest.card


def encode_weights(weights: Mapping[str, torch.Tensor]) -> bytes:
    """safetensors bytes of ``<unit>.<name>`` tensors (contiguous CPU copies; shared storages are copied)."""
    plain = {name: t.detach().cpu().contiguous().clone() for name, t in weights.items()}
    return save_safetensors(plain)


def decode_weights(data: bytes, where: str) -> dict[str, torch.Tensor]:
    try:
        return load_safetensors(data)
    except (SafetensorError, ValueError, RuntimeError) as exc:
        raise ExportError(f"{where}: not readable safetensors: {exc}") from exc


def write_export(
    directory: Path, manifest: ExportManifest, weights_data: bytes, onnx_data: bytes | None = None
) -> Path:
    """Write the weights (and ONNX), then the manifest; return the manifest's path. ``manifest.sha256`` must
    be the weights' checksum (:func:`sha256_hex`)."""
    if hashlib.sha256(weights_data).hexdigest() != manifest.sha256:
        raise ExportError("export: the manifest's sha256 is not the weights' (a bug: compute it from the bytes)")
    directory.mkdir(parents=True, exist_ok=True)
    (directory / WEIGHTS_FILE).write_bytes(weights_data)
    if onnx_data is not None:
        (directory / ONNX_FILE).write_bytes(onnx_data)
    path = directory / MANIFEST_FILE
    path.write_text(manifest.to_json())
    return path


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def load_export(directory: str | Path) -> LoadedModel:
    """Rebuild an exported model from its directory alone (checksum verified, weights loaded strictly)."""
    directory = Path(directory)
    manifest_path = directory / MANIFEST_FILE
    try:
        manifest = ExportManifest.from_json(manifest_path.read_text(), str(manifest_path))
        data = (directory / WEIGHTS_FILE).read_bytes()
    except OSError as exc:
        raise ExportError(
            f"cannot read the export in {str(directory)!r}: {exc.strerror or exc} (expected {MANIFEST_FILE} and "
            f"{WEIGHTS_FILE}, written by `ferret export --out DIR`)"
        ) from exc
    if sha256_hex(data) != manifest.sha256:
        raise ExportError(
            f"{directory / WEIGHTS_FILE}: sha256 {sha256_hex(data)[:12]}…, the manifest says {manifest.sha256[:12]}… "
            "(a modified or truncated file: export again)"
        )
    weights = decode_weights(data, str(directory / WEIGHTS_FILE))
    return LoadedModel(rebuild(manifest.card, weights), manifest)


def onnx_bytes(model: nn.Module, card: ModelCard) -> bytes:
    """The model as ONNX (batch dimension dynamic). Raises :class:`ExportError` saying why when torch.onnx
    cannot export here (its exporter needs the ``onnx`` and ``onnxscript`` packages, not installed by
    default)."""
    import importlib.util
    import tempfile

    if importlib.util.find_spec("onnx") is None:  # torch.onnx's exporter imports it: fail with our message first
        raise ExportError(
            "ONNX export is not available: torch.onnx needs the onnx and onnxscript packages, which Ferret does "
            "not install (pip install onnx onnxscript), then export again with --onnx; the safetensors export "
            "works without them"
        )
    example = torch.zeros((1, *card.input_shape))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / ONNX_FILE
        try:
            torch.onnx.export(
                model, (example,), str(path), input_names=["input"], output_names=["logits"],
                dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}},
            )  # fmt: skip
        except Exception as exc:  # the exporter raises many types for unsupported operators
            raise ExportError(f"torch.onnx cannot export model {card.model!r}: {type(exc).__name__}: {exc}") from exc
        return path.read_bytes()
