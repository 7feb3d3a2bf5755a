"""The committed stubs in services/proto_gen are what scripts/gen_proto.sh makes from proto/ (STYLE 12)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ROOT / "services" / "proto_gen"


def _tree(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.suffix in {".py", ".pyi"}
    }


def test_generated_stubs_are_fresh(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools.protoc", reason="grpcio-tools (dev extra) is not installed")
    env = {**os.environ, "PYTHON": sys.executable}
    result = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gen_proto.sh"), str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    fresh, committed = _tree(tmp_path), _tree(GENERATED)
    stale = sorted(name for name in fresh.keys() | committed.keys() if fresh.get(name) != committed.get(name))
    assert not stale, f"stale generated stubs {stale}: run scripts/gen_proto.sh and commit services/proto_gen"


def test_stubs_import_from_the_package() -> None:
    from services.proto_gen.ferret.v1 import control_pb2, control_pb2_grpc, messages_pb2

    sample = messages_pb2.Sample(id="mnist/7", sequence=7, stream="mnist")
    sample.tensor.shape.extend([1, 28, 28])
    sample.tensor.dtype = "uint8"
    sample.tensor.data = bytes(784)
    decoded = messages_pb2.Sample.FromString(sample.SerializeToString())
    assert decoded == sample
    assert not decoded.HasField("label")
    assert control_pb2.PlanReply.DESCRIPTOR.full_name == "ferret.v1.PlanReply"
    assert hasattr(control_pb2_grpc, "ControlStub")
    method_names = [m.name for m in control_pb2.DESCRIPTOR.services_by_name["Control"].methods]
    assert method_names == [
        "SetMemoryBudget",
        "GetPlan",
        "GetStatus",
        "WatchStatus",
        "SaveSnapshot",
        "RestoreSnapshot",
        "ListSnapshots",
    ]


def test_proto_changes_stay_compatible_with_the_published_baseline() -> None:
    """``buf breaking`` (FILE rules, proto/buf.yaml) of proto/ against proto/ferret-v1.baseline.json: within
    ferret.v1 fields are only added (docs/predictions.md "Versioning")."""
    local = Path(sys.executable).parent / "buf"
    buf = str(local) if local.is_file() else shutil.which("buf")
    if buf is None:
        pytest.skip("buf is not installed (the buf-bin wheel of the dev extra: bash scripts/setup.sh)")
    result = subprocess.run(
        [buf, "breaking", "--against", "ferret-v1.baseline.json"],
        cwd=ROOT / "proto",
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, f"proto/ breaks ferret.v1 compatibility:\n{result.stdout}{result.stderr}"
