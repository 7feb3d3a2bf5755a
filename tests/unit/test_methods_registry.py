"""The method registry: one source of every method's name, policy, plan need and reference (DESIGN §4)."""

from __future__ import annotations

import pytest

from ferret_core.engine import METHOD_NAMES, MethodOptions, make_policy
from ferret_core.engine.method_registry import method
from ferret_core.errors import ConfigError
from tests.unit.test_engine_support import make_plan

# DESIGN §4 "Names": methods
DESIGN_METHODS = ("oracle", "1-skip", "random-n", "last-n", "camel", "dapple", "zb", "hanayo-1w", "hanayo-2w",
                  "hanayo-3w", "pipedream", "pipedream-2bw", "ferret")


def test_registered_names_are_designs_in_its_order() -> None:
    assert METHOD_NAMES == DESIGN_METHODS


@pytest.mark.parametrize("name", METHOD_NAMES)
def test_each_method_builds_its_policy_by_name(name: str) -> None:
    spec = method(name)
    plan = make_plan(3, 2)
    policy = make_policy(name, plan, options=MethodOptions(flush_every=3))
    assert policy.name == name
    setup = policy.setup("tiny", 3, 1.0)
    assert setup.method == name
    if spec.needs_plan:
        assert setup.plan.partition == plan.partition
        with pytest.raises(ConfigError, match="plan"):
            make_policy(name)


def test_an_unknown_method_lists_the_names() -> None:
    with pytest.raises(ConfigError, match="expected one of oracle, 1-skip"):
        make_policy("gpipe")


def test_schedules_run_on_ferrets_partition_and_slots_with_every_slot_live() -> None:
    plan = make_plan(3, 3, live=[True, False, True], omission=1, accumulation=2)
    for name in ("dapple", "zb", "pipedream", "pipedream-2bw"):
        setup = make_policy(name, plan).setup("tiny", 3, 1.0)
        assert setup.plan.partition == plan.partition and setup.plan.num_workers == 3
        assert all(w.live and w.omission == (0, 0, 0) for w in setup.plan.workers)
        expected = 3 if name == "pipedream-2bw" else 1
        assert all(w.accumulation == (expected,) * 3 for w in setup.plan.workers)
    assert make_policy("hanayo-3w", plan).setup("tiny", 3, 1.0).plan.num_workers == 18


def test_a_schedule_runs_on_a_layout_of_your_choice() -> None:
    from ferret_core.engine import EngineSettings, StreamEngine, layout_plan
    from ferret_core.plan import Partition
    from tests.unit.test_engine_policies import tiny_profile
    from tests.unit.test_engine_support import stream, tiny_units, uniform_times

    plan = make_plan(3, 2, accumulation=2, omission=1)
    layout = layout_plan(plan, Partition((0, 1, 3)), 4)
    assert (layout.num_stages, layout.num_workers, layout.planned_bytes, layout.steps) == (2, 4, 0, ())
    assert all(w.live and w.accumulation == (1, 1) and w.omission == (0, 0) for w in layout.workers)
    setup = make_policy("dapple", layout, profile=tiny_profile()).setup("tiny", 3, 1.0)
    assert setup.plan.partition == Partition((0, 1, 3)) and setup.plan.num_workers == 4
    assert setup.planned is not None and setup.planned.planned_bytes > 0  # its own bytes on this layout
    r = StreamEngine(tiny_units(num_units=3), setup, EngineSettings()).run_virtual(
        stream(12), uniform_times(2), 1.0
    )
    assert r.trained_any_stage + sum(r.skipped.values()) == r.items == 12
    with pytest.raises(ConfigError, match="2 units cannot drive a model of 3 units"):
        layout_plan(plan, Partition((0, 1, 2)), 1)
    with pytest.raises(ConfigError, match="at least one worker slot"):
        layout_plan(plan, Partition((0, 3)), 0)


def test_buffering_methods_take_their_settings_budget_and_footprint_from_the_options() -> None:
    from ferret_core.engine.buffering import BufferingPolicy, BufferingSettings
    from ferret_core.engine.steps import Footprint

    footprint = Footprint(replay_items=7)
    options = MethodOptions(buffering=BufferingSettings(batch=4, window=8), footprint=footprint)
    for name in ("random-n", "last-n", "camel"):
        policy = make_policy(name, options=options)
        assert isinstance(policy, BufferingPolicy)
        assert (policy.settings.batch, policy.settings.window, policy.footprint) == (4, 8, footprint)
        setup = policy.setup("tiny", 3, 1.0)
        assert setup.feeder is not None and setup.plan.num_workers == 1 and setup.plan.num_stages == 1
        with pytest.raises(ConfigError, match="profile"):  # a budget fits N from the profile
            make_policy(name, options=MethodOptions(budget=1 << 20))
