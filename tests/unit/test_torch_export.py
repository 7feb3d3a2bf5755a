"""``ferret export --torch-export``: the model as a ``torch.export`` program (``model.pt2``), loaded in a fresh
process with ``torch.export.load`` alone, predicts as the safetensors export; every zoo model exports; a
model torch.export refuses fails naming the model and torch's reason, and the safetensors export still works."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import cast

import pytest
import torch
from torch import nn

from services.serving.errors import ExportError
from services.serving.export_files import (
    MANIFEST_FILE,
    TORCH_EXPORT_FILE,
    WEIGHTS_FILE,
    load_export,
    torch_export_bytes,
)
from services.serving.exporter import export_snapshot
from services.serving.model_card import ModelCard, predict_probabilities, rebuild, unit_weights
from services.snapshots import SnapshotPayload, SnapshotStore
from services.trainer.unit_weights import snapshot_tensors

ROOT = Path(__file__).resolve().parents[2]
BRANCHY = "tests.unit.test_torch_export:branchy"  # a BYO model torch.export refuses


class DataDependentHead(nn.Module):
    """Picks a head by the batch's values: Python control flow on data, which torch.export cannot trace."""

    def __init__(self, features: int, classes: int) -> None:
        super().__init__()
        self.a = nn.Linear(features, classes)
        self.b = nn.Linear(features, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(x) if float(x.sum()) > 0 else self.b(x)


def branchy(input_shape: tuple[int, ...], num_classes: int) -> nn.Sequential:
    features = 1
    for size in input_shape:
        features *= size
    return nn.Sequential(nn.Flatten(), DataDependentHead(features, num_classes))


class OneSnapshot:
    """The part of SnapshotStore that export_snapshot reads, holding one payload."""

    instance_id = "r0"

    def __init__(self, payload: SnapshotPayload) -> None:
        self.payload = payload

    def load(self, version: int) -> SnapshotPayload:
        assert version == self.payload.version
        return self.payload

    def load_latest_valid(self) -> SnapshotPayload:
        return self.payload


def snapshot_of(card: ModelCard, seed: int = 3, version: int = 7) -> SnapshotStore:
    """A store with one snapshot of ``card``'s model, weights moved off a fresh build's."""
    model = card.build()
    generator = torch.Generator().manual_seed(seed)
    state = {}
    for unit, module in enumerate(model.units):
        for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
            noise = 0.01 * torch.randn(tensor.shape, generator=generator) if tensor.is_floating_point() else 0
            state[(unit, name)] = tensor.detach() + noise
    tensors = snapshot_tensors(state, model_version=41)
    payload = SnapshotPayload(tensors=tensors, meta={"model_card": card.to_dict()}, version=version)
    return cast("SnapshotStore", OneSnapshot(payload))


FRESH_LOADER = (
    "import json, sys, torch\n"
    "program = torch.export.load(sys.argv[1]).module()\n"
    "xs = torch.load(sys.argv[2])\n"
    "with torch.no_grad():\n"
    "    p = torch.softmax(program(xs), dim=1)\n"
    "print(json.dumps({'classes': p.argmax(1).tolist(), 'confidences': p.max(1).values.tolist(),\n"
    "                  'modules': sorted(m for m in sys.modules if m.split('.')[0] in ('services', 'ferret_core'))}))\n"
)


def test_the_program_loads_in_a_fresh_process_with_torch_alone_and_predicts_as_the_safetensors_export(
    tmp_path: Path,
) -> None:
    card = ModelCard("mnistnet", (1, 28, 28), 10)
    result = export_snapshot(snapshot_of(card), tmp_path / "out", torch_export=True)
    manifest = json.loads((tmp_path / "out" / MANIFEST_FILE).read_text())
    assert manifest["files"] == [WEIGHTS_FILE, TORCH_EXPORT_FILE, MANIFEST_FILE]
    assert manifest["torch_export"]["file"] == TORCH_EXPORT_FILE
    assert manifest["torch_export"]["torch"] == torch.__version__
    assert load_export(tmp_path / "out").manifest == result.manifest

    xs = torch.rand(37, 1, 28, 28, generator=torch.Generator().manual_seed(1))  # a batch size it was not traced at
    torch.save(xs, tmp_path / "xs.pt")
    fresh = subprocess.run(
        [sys.executable, "-c", FRESH_LOADER, str(tmp_path / "out" / TORCH_EXPORT_FILE), str(tmp_path / "xs.pt")],
        cwd=tmp_path, env={"PATH": os.environ["PATH"]}, capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    got = json.loads(fresh.stdout)
    assert got["modules"] == []  # torch alone: no project code on the path or imported
    expected = predict_probabilities(load_export(tmp_path / "out").model, xs)
    assert got["classes"] == expected.argmax(1).tolist()
    torch.testing.assert_close(torch.tensor(got["confidences"]), expected.max(1).values, rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    ("model", "input_shape"),
    [("mlp", (1, 8, 8)), ("mnistnet", (1, 28, 28)), ("convnet", (3, 16, 16)), ("resnet18", (3, 16, 16))],
)
def test_every_zoo_model_exports_with_a_dynamic_batch(model: str, input_shape: tuple[int, ...]) -> None:
    import io

    card = ModelCard(model, input_shape, 10)
    store = snapshot_of(card)
    net = rebuild(card, unit_weights(store.load_latest_valid().tensors))
    program = torch.export.load(io.BytesIO(torch_export_bytes(net, card))).module()
    for batch in (1, 5):
        xs = torch.rand((batch, *input_shape), generator=torch.Generator().manual_seed(batch))
        with torch.no_grad():
            torch.testing.assert_close(torch.softmax(program(xs), 1), predict_probabilities(net, xs), rtol=0, atol=1e-5)


def test_a_model_torch_export_refuses_fails_naming_it_and_the_safetensors_export_still_works(tmp_path: Path) -> None:
    card = ModelCard(BRANCHY, (1, 4, 4), 3)
    store = snapshot_of(card)
    refused = rf"torch.export cannot export model '{BRANCHY}': \w+: .+without --torch-export"
    with pytest.raises(ExportError, match=refused):
        export_snapshot(store, tmp_path / "refused", torch_export=True)
    assert not (tmp_path / "refused").exists()  # refused before anything was written
    result = export_snapshot(store, tmp_path / "plain")
    assert result.manifest.files == [WEIGHTS_FILE, MANIFEST_FILE] and result.manifest.torch_export is None
    assert load_export(tmp_path / "plain").manifest.model_version == 41


def test_a_modified_program_file_is_refused(tmp_path: Path) -> None:
    export_snapshot(snapshot_of(ModelCard("mlp", (1, 8, 8), 10)), tmp_path, torch_export=True)
    data = bytearray((tmp_path / TORCH_EXPORT_FILE).read_bytes())
    data[-1] ^= 0xFF
    (tmp_path / TORCH_EXPORT_FILE).write_bytes(bytes(data))
    with pytest.raises(ExportError, match=rf"{TORCH_EXPORT_FILE}: sha256 .* the manifest says"):
        load_export(tmp_path)
    (tmp_path / TORCH_EXPORT_FILE).unlink()
    with pytest.raises(ExportError, match="the manifest lists it but it cannot be read"):
        load_export(tmp_path)
