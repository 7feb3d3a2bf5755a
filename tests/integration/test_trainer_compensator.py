"""The compensators' state through a real Redis snapshot (DESIGN §4): a trainer saves, a new trainer
process-alike restores, and λ, v_r, v_a and the delta ring are equal."""

from __future__ import annotations

import pytest
import redis

from ferret_core.data import dataset_spec
from services.kafka.record_codec import SampleDecoder
from services.snapshots import SnapshotStore
from services.trainer.engine_learner import EngineLearner
from services.trainer.runner import assemble, build_zoo_model
from tests.unit.test_trainer_checkpoints import assert_same, trained_learner

from .trainer_support import settings_for

pytestmark = pytest.mark.integration


def test_compensator_state_survives_a_snapshot_in_redis(redis_url: str, topic_prefix: str) -> None:
    settings = settings_for(  # Iter-Fisher, as trained_learner(): its delta ring goes through Redis too
        "127.0.0.1:1", redis_url, topic_prefix, FERRET_TRAINER_MODEL="mlp", FERRET_TRAINER_COMPENSATOR="iter-fisher"
    )
    client = redis.Redis.from_url(redis_url)
    store = SnapshotStore(client, settings.redis.namespace, settings.kafka.resolved_instance_id())
    decoder = SampleDecoder(*dataset_spec("digits"))
    first = trained_learner()
    second = EngineLearner(build_zoo_model(settings), first.plan, settings)
    try:
        saved = first.compensator_state()
        info = assemble(settings, first, decoder, store).port.save_snapshot({"reason": "test"})
        manifest = store.manifest(info.version)
        assert manifest.compensator["stages"] and any(n.startswith("compensator.") for n in manifest.tensors)
        restored = assemble(settings, second, decoder, store).restore_latest()
        assert restored is not None and restored.version == info.version
        assert_same(saved, second.compensator_state())
        assert saved[0]["lambda"] != 0.2  # λ had moved from λ⁰: a reset would not pass
    finally:
        first.close()
        second.close()
        client.close()
