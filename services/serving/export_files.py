"""``ferret export``'s files and their loader: a directory with

    model.safetensors   the units' tensors under ``<unit>.<name>`` (``nn.Sequential`` state-dict keys),
                        safetensors: no pickle, readable from Rust, C++, JavaScript, NumPy
    manifest.json       format, the model card (spec, input shape, classes, input contract), the model
                        version, the plan, the stream offsets the weights cover, the snapshot version and
                        instance it came from, and the sha256 of model.safetensors
    model.pt2           optional (``--torch-export``): the model as a ``torch.export`` ExportedProgram
                        (graph + weights, batch dimension dynamic), saved with ``torch.export.save``;
                        ``torch.export.load(path).module()`` runs it without Ferret's code
    model.onnx          optional (``--onnx``), where torch.onnx can export the model here

The manifest's ``files`` lists the files the export holds. :func:`load_export` checks the checksums and
rebuilds the model from the card alone: no Redis, Kafka or trainer. The manifest is written last, so a
directory without one is an interrupted export.
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
TORCH_EXPORT_FILE = "model.pt2"


@dataclass(frozen=True)
class TorchExportFile:
    """``manifest.json``'s ``torch_export``: the ``model.pt2`` file, its checksum and size, and the torch
    version that wrote it (an ExportedProgram loads in that torch version and, as a rule, newer ones)."""

    sha256: str
    size: int
    torch_version: str

    def to_dict(self) -> dict[str, Any]:
        return {"file": TORCH_EXPORT_FILE, "sha256": self.sha256, "bytes": self.size, "torch": self.torch_version}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TorchExportFile:
        if data["file"] != TORCH_EXPORT_FILE:
            raise ValueError(f"torch_export file {data['file']!r}, expected {TORCH_EXPORT_FILE!r}")
        return cls(sha256=str(data["sha256"]), size=int(data["bytes"]), torch_version=str(data["torch"]))

    @classmethod
    def of(cls, data: bytes) -> TorchExportFile:
        return cls(sha256=sha256_hex(data), size=len(data), torch_version=str(torch.__version__))


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
    torch_export: TorchExportFile | None = None
    model_lineage: int = 0  # the lineage model_version counts along (0: unknown)

    @property
    def files(self) -> list[str]:
        """The files of the export directory, the manifest included."""
        extra = [TORCH_EXPORT_FILE] if self.torch_export is not None else []
        return [WEIGHTS_FILE, *extra, *([ONNX_FILE] if self.onnx else []), MANIFEST_FILE]

    def to_json(self) -> str:
        document = {
            "format": EXPORT_FORMAT,
            "weights": WEIGHTS_FILE,
            "sha256": self.sha256,
            "weights_bytes": self.weights_bytes,
            "card": self.card.to_dict(),
            "model_version": self.model_version,
            "model_lineage": self.model_lineage,
            "plan": dict(self.plan),
            "offsets": {t: {str(p): int(o) for p, o in parts.items()} for t, parts in self.offsets.items()},
            "snapshot_version": self.snapshot_version,
            "instance_id": self.instance_id,
            "created_time_ms": self.created_time_ms,
            "onnx": ONNX_FILE if self.onnx else None,
            "torch_export": None if self.torch_export is None else self.torch_export.to_dict(),
            "files": self.files,
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
                torch_export=TorchExportFile.from_dict(doc["torch_export"]) if doc.get("torch_export") else None,
                model_lineage=int(doc.get("model_lineage", 0)),
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
    directory: Path,
    manifest: ExportManifest,
    weights_data: bytes,
    onnx_data: bytes | None = None,
    torch_export_data: bytes | None = None,
) -> Path:
    """Write the weights (and the ExportedProgram, ONNX), then the manifest; return the manifest's path.
    ``manifest.sha256`` must be the weights' checksum (:func:`sha256_hex`), ``manifest.torch_export``
    describe ``torch_export_data`` (:meth:`TorchExportFile.of`)."""
    if hashlib.sha256(weights_data).hexdigest() != manifest.sha256:
        raise ExportError("export: the manifest's sha256 is not the weights' (a bug: compute it from the bytes)")
    wanted = None if torch_export_data is None else TorchExportFile.of(torch_export_data)
    if (wanted is None) != (manifest.torch_export is None) or (
        wanted is not None and manifest.torch_export is not None and wanted.sha256 != manifest.torch_export.sha256
    ):
        raise ExportError(
            f"export: the manifest's torch_export does not describe the {TORCH_EXPORT_FILE} bytes given "
            "(a bug: build it with TorchExportFile.of(data))"
        )
    directory.mkdir(parents=True, exist_ok=True)
    (directory / WEIGHTS_FILE).write_bytes(weights_data)
    if torch_export_data is not None:
        (directory / TORCH_EXPORT_FILE).write_bytes(torch_export_data)
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
    if manifest.torch_export is not None:
        check_torch_export_file(directory, manifest.torch_export)
    weights = decode_weights(data, str(directory / WEIGHTS_FILE))
    return LoadedModel(rebuild(manifest.card, weights), manifest)


def check_torch_export_file(directory: Path, described: TorchExportFile) -> None:
    """The manifest's ``model.pt2`` is there with its checksum (its graph is checked when exported)."""
    path = directory / TORCH_EXPORT_FILE
    try:
        digest = sha256_hex(path.read_bytes())
    except OSError as exc:
        raise ExportError(
            f"{path}: the manifest lists it but it cannot be read ({exc.strerror or exc}): export again"
        ) from exc
    if digest != described.sha256:
        raise ExportError(
            f"{path}: sha256 {digest[:12]}…, the manifest says {described.sha256[:12]}… (a modified or truncated "
            "file: export again)"
        )


def torch_export_bytes(model: nn.Module, card: ModelCard) -> bytes:
    """The model as a ``torch.export`` ExportedProgram (batch dimension dynamic) in ``torch.export.save``'s
    format, checked before returning: loaded back, it must predict as ``model`` does on a random batch.
    Raises :class:`ExportError` naming the model and torch's reason when torch.export refuses the model
    (data-dependent control flow, unsupported Python in ``forward``)."""
    import io

    generator = torch.Generator().manual_seed(0)
    example = torch.rand((2, *card.input_shape), generator=generator)
    batch = torch.export.Dim("batch", min=1)
    try:
        program = torch.export.export(model, (example,), dynamic_shapes=({0: batch},), strict=False)
        buffer = io.BytesIO()
        torch.export.save(program, buffer)
    except Exception as exc:  # torch.export raises many types (UserError, Unsupported, GuardOnDataDependent…)
        reason = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")[:500]
        raise ExportError(
            f"torch.export cannot export model {card.model!r}: {type(exc).__name__}: {reason} (the safetensors "
            f"export works without --torch-export)"
        ) from exc
    data = buffer.getvalue()
    _check_program(data, model, card, torch.rand((3, *card.input_shape), generator=generator))
    return data


def _check_program(data: bytes, model: nn.Module, card: ModelCard, xs: torch.Tensor) -> None:
    import io

    program = torch.export.load(io.BytesIO(data))
    with torch.no_grad():
        got = torch.softmax(program.module()(xs).float(), dim=1)
        expected = torch.softmax(model(xs).float(), dim=1)
    if got.shape != expected.shape or not torch.allclose(got, expected, rtol=0, atol=1e-5):
        error = (got - expected).abs().max().item() if got.shape == expected.shape else float("nan")
        raise ExportError(
            f"torch.export's program of model {card.model!r} does not predict as the model does (max probability "
            f"difference {error:.3g}, shapes {list(got.shape)} vs {list(expected.shape)}, expected within 1e-5): "
            "export without --torch-export"
        )


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
