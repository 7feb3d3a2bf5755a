"""``ferret export``'s options for a running trainer: a trainer that cannot be reached is a one-line failure
naming it and the gRPC code, and the options that only make sense together are refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.cli.main import main
from services.localstack.ports import free_port


def test_an_unreachable_trainer_is_a_one_line_failure_and_nothing_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = f"127.0.0.1:{free_port()}"  # nothing listens there
    status = main(["export", "--from-trainer", target, "--timeout", "5", "--out", str(tmp_path / "out")])
    assert status == 1
    assert f"ferret export: the trainer at {target} took no snapshot: UNAVAILABLE" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_version_and_a_trainer_exclude_each_other(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["export", "--version", "3", "--from-trainer", "127.0.0.1:1", "--out", str(tmp_path)])
    assert exited.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_a_tls_ca_without_a_trainer_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("not used\n")
    assert main(["export", "--tls-ca", str(ca), "--out", str(tmp_path / "out")]) == 2
    assert "--tls-ca is for the control plane of --from-trainer" in capsys.readouterr().err
