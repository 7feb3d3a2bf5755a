"""Every pipeline schedule's literal action table for P = 3 stages and 4 items, kept as readable fixtures
(``tests/unit/fixtures/schedules/<method>.txt``): one worker slot, t̂^f = 1 and t̂^b = 2 per stage, one item
per time unit, the default flush group m = P. A change in any schedule shows up here as a diff of the
table. After an intended change, regenerate them with ``FERRET_REGENERATE_FIXTURES=1 pytest
tests/unit/test_schedule_tables.py`` and read the diff."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ferret_core.engine import EngineSettings, StreamEngine, make_policy
from ferret_core.engine.schedules import FlushRules
from ferret_core.engine.trace import format_table
from tests.unit.test_engine_support import make_plan, stream, tiny_units, uniform_times

FIXTURES = Path(__file__).parent / "fixtures" / "schedules"
SCHEDULES = ("dapple", "zb", "hanayo-1w", "hanayo-2w", "hanayo-3w", "pipedream", "pipedream-2bw")


def action_table(method: str, stages: int = 3, items: int = 4) -> str:
    plan = make_plan(stages, 1)
    setup = make_policy(method, plan).setup("tiny", stages, 1.0)
    engine = StreamEngine(tiny_units(num_units=stages), setup, EngineSettings(measure_memory=False))
    r = engine.run_virtual(stream(items), uniform_times(stages), 1.0)
    assert r.trace is not None
    skipped = ", ".join(f"{k} {v}" for k, v in r.skipped.items() if v) or "none"
    devices = ""
    if isinstance(setup.rules, FlushRules) and setup.rules.devices:
        shared: dict[tuple[int, int], list[str]] = {}
        for (n, j), device in sorted(setup.rules.devices.items()):
            shared.setdefault(device, []).append(f"w{n}s{j}")
        devices = "devices (one action at a time each): " + "; ".join(
            f"d{device[1]} = {' '.join(executors)}" for device, executors in sorted(shared.items())
        ) + "\n"
    head = (
        f"{method}: P = {stages}, {items} items arriving at t = 0, 1, 2, …; t̂^f = 1, t̂^b = 2 per stage; "
        f"{setup.plan.num_workers} row(s) of executors w<row>s<stage>\n"
        f"trained {r.trained}, skipped: {skipped}; updates per stage {list(r.updates_per_stage)}; "
        f"max staleness {list(r.max_staleness)}\n"
        f"{devices}"
        "cells: actions starting at that time (F forward, B backward — input gradient only under zb —, "
        "W weight gradient, R recompute, +U the update after it)\n\n"
    )
    return head + format_table(r.trace, window=10_000) + "\n"


@pytest.mark.parametrize("method", SCHEDULES)
def test_action_table_matches_the_fixture(method: str) -> None:
    table = action_table(method)
    path = FIXTURES / f"{method}.txt"
    if os.environ.get("FERRET_REGENERATE_FIXTURES"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(table)
    assert path.read_text() == table, f"{method}'s action table changed:\n{table}"
