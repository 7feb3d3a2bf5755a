"""The method registry: one source of every method's name, policy, plan need and reference (DESIGN §4)."""

from __future__ import annotations

import pytest

from ferret_core.engine import METHOD_NAMES, METHODS, MethodOptions, make_policy
from ferret_core.engine.methods import method
from ferret_core.errors import ConfigError
from tests.unit.test_engine_support import make_plan

# DESIGN §4 "Names": methods
DESIGN_METHODS = ("oracle", "1-skip", "random-n", "last-n", "camel", "dapple", "zb", "hanayo-1w", "hanayo-2w",
                  "hanayo-3w", "pipedream", "pipedream-2bw", "ferret")
# registered by issue 8 part B (buffering baselines), merged separately; drop this once they are in
PART_B = {"random-n", "last-n", "camel"}


def test_registered_names_are_designs_in_its_order() -> None:
    assert set(METHOD_NAMES) <= set(DESIGN_METHODS)
    assert set(DESIGN_METHODS) - set(METHOD_NAMES) <= PART_B
    assert list(METHOD_NAMES) == [m for m in DESIGN_METHODS if m in METHODS]


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
