"""The guard around the learner on executor processes (the wrapper ``make_learner`` builds when the
trainer trains on processes): a learner on the digits that learns, then has its master overwritten with
wrong weights behind the guard's back (a stand-in for a poisoning burst), is rolled back through
``ProcessLearner.load_state_tensors``, and its predictions carry the last-good version again."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from ferret_core.data import load_dataset
from ferret_core.data.dataset import normalise
from services.trainer.guard.learner import GuardedLearner
from services.trainer.runner import build_zoo_model

from .test_process_learner import _learner, _settings

pytestmark = pytest.mark.integration


def test_a_learner_on_processes_is_rolled_back_to_the_last_good_weights() -> None:
    settings = _settings()
    inner, _, _ = _learner()
    guard = replace(settings.guard, probation_items=100)  # promoted within the 600 items (windows of 200)
    guarded = GuardedLearner(inner, build_zoo_model(settings), guard)
    ds = load_dataset("digits", None)
    xs, ys = normalise(ds.x_train), [int(y) for y in ds.y_train]
    try:
        for i in range(600):  # learns, and is promoted
            guarded.submit(i, xs[i], ys[i])()
            guarded.drain(30)
        stats = guarded.stats().guard
        assert stats is not None and stats.promotions >= 2 and stats.rollbacks == 0
        state = inner.state_tensors()
        wrecked = {k: (torch.randn_like(v) * 3 if k.startswith("model.") else v) for k, v in state.items()}
        inner.load_state_tensors(wrecked)  # behind the guard's back
        versions = []
        for i in range(600, 1000):
            versions.append(guarded.submit(i, xs[i], ys[i])().model_version)
            guarded.drain(30)
        stats = guarded.stats().guard
        assert stats is not None and stats.rollbacks == 1
        rollback = next(e for e in guarded.take_events() if e.kind == "rollback")
        assert rollback.item < 800 and rollback.model_version < rollback.previous_model_version
        back = rollback.item - 600 + 1  # carried out before the next submission
        assert versions[back] == rollback.model_version < versions[back - 1]
    finally:
        guarded.close()
