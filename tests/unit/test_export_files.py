"""``ferret export``'s files: the safetensors + manifest round trip, the loader's checks, the model card."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from services.serving.errors import ExportError
from services.serving.export_files import (
    MANIFEST_FILE,
    WEIGHTS_FILE,
    ExportManifest,
    encode_weights,
    load_export,
    onnx_bytes,
    sha256_hex,
    write_export,
)
from services.serving.model_card import ModelCard, model_version, predict_probabilities, rebuild, unit_weights
from services.trainer.unit_weights import snapshot_tensors

CARD = ModelCard("mnistnet", (1, 28, 28), 10)


def trained_tensors(seed: int = 3) -> dict[str, torch.Tensor]:
    """A learner's ``state_tensors()`` of MNISTNet with weights unlike a fresh build's."""
    model = CARD.build()
    generator = torch.Generator().manual_seed(seed)
    state = {}
    for unit, module in enumerate(model.units):
        for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
            state[(unit, name)] = tensor.detach() + 0.01 * torch.randn(tensor.shape, generator=generator)
    return snapshot_tensors(state, model_version=41)


def export(tmp_path: Path, tensors: dict[str, torch.Tensor]) -> ExportManifest:
    data = encode_weights(unit_weights(tensors))
    manifest = ExportManifest(
        card=CARD, model_version=model_version(tensors), sha256=sha256_hex(data), weights_bytes=len(data),
        plan={"model": "mnistnet"}, offsets={"f.samples": {0: 12, 1: 7}}, snapshot_version=5, instance_id="r0",
    )  # fmt: skip
    write_export(tmp_path, manifest, data)
    return manifest


def test_an_export_loads_back_with_the_same_predictions(tmp_path: Path) -> None:
    tensors = trained_tensors()
    written = export(tmp_path, tensors)
    loaded = load_export(tmp_path)
    assert loaded.manifest == written
    assert loaded.manifest.model_version == 41
    assert loaded.manifest.offsets == {"f.samples": {0: 12, 1: 7}}
    xs = torch.rand(16, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    expected = predict_probabilities(rebuild(CARD, unit_weights(tensors)), xs)
    torch.testing.assert_close(predict_probabilities(loaded.model, xs), expected, rtol=0, atol=0)
    fresh = predict_probabilities(rebuild(CARD, unit_weights(trained_tensors(seed=4))), xs)
    assert not torch.equal(fresh, expected)  # the weights matter: another set predicts otherwise


def test_the_manifest_is_plain_json_naming_what_rebuilds_the_model(tmp_path: Path) -> None:
    export(tmp_path, trained_tensors())
    document = json.loads((tmp_path / MANIFEST_FILE).read_text())
    assert document["card"] == {
        "model": "mnistnet", "input_shape": [1, 28, 28], "num_classes": 10, "input_range": [-1000.0, 1000.0],
        "input_normaliser": "none",
    }  # fmt: skip
    assert document["weights"] == WEIGHTS_FILE
    assert document["sha256"] == sha256_hex((tmp_path / WEIGHTS_FILE).read_bytes())
    from safetensors.torch import load_file

    names = set(load_file(str(tmp_path / WEIGHTS_FILE)))
    assert names == set(CARD.build().as_sequential().state_dict())  # nn.Sequential keys: "<unit>.<name>"


def test_a_modified_weights_file_is_refused(tmp_path: Path) -> None:
    export(tmp_path, trained_tensors())
    data = bytearray((tmp_path / WEIGHTS_FILE).read_bytes())
    data[-1] ^= 0xFF
    (tmp_path / WEIGHTS_FILE).write_bytes(bytes(data))
    with pytest.raises(ExportError, match=r"sha256 .* the manifest says"):
        load_export(tmp_path)


def test_a_missing_export_names_the_files_it_expects(tmp_path: Path) -> None:
    with pytest.raises(ExportError, match=f"expected {MANIFEST_FILE} and {WEIGHTS_FILE}"):
        load_export(tmp_path / "nothing")


def test_weights_of_another_model_are_refused_with_the_reason() -> None:
    with pytest.raises(ExportError, match="do not fit model 'mlp'"):
        rebuild(ModelCard("mlp", (1, 28, 28), 10), unit_weights(trained_tensors()))


def test_a_malformed_card_is_an_export_error() -> None:
    with pytest.raises(ExportError, match="expected model, input_shape, num_classes"):
        ModelCard.from_dict({"model": "mnistnet"})
    assert ModelCard.from_dict(CARD.to_dict()) == CARD


@pytest.mark.skipif(importlib.util.find_spec("onnx") is not None, reason="onnx is installed here")
def test_onnx_without_its_packages_says_it_is_not_available() -> None:
    with pytest.raises(ExportError, match=r"ONNX export is not available: .*pip install onnx onnxscript"):
        onnx_bytes(rebuild(CARD, unit_weights(trained_tensors())), CARD)


def test_the_card_knows_the_record_paths_input_contract() -> None:
    from services.kafka import record_codec
    from services.serving import model_card

    assert model_card.DEFAULT_INPUT_RANGE == record_codec.DEFAULT_INPUT_RANGE
    assert model_card.NORMALISERS == record_codec.NORMALISERS
