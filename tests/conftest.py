"""Shared test configuration."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch
from hypothesis import HealthCheck, settings

torch.set_num_threads(1)

settings.register_profile(
    "ci",
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", max_examples=30, deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


@pytest.fixture(autouse=True)
def _restore_float_mode() -> Iterator[None]:
    """Commands run in-process set torch.set_flush_denormal(True) (DESIGN §5); that is process-wide and
    makes hypothesis refuse to generate floats, so put the default back after every test."""
    yield
    torch.set_flush_denormal(False)
