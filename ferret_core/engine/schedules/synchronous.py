"""Synchronous pipeline schedules as policies: DAPPLE, zero bubble (ZB) and Hanayo with 1–3 waves.

All three flush: every pipeline row takes m micro-batches (default m = P), all of them read the same
weights, their gradients are summed and applied once per stage, and a row takes nothing more until
stage 0 has flushed (arrivals for it meanwhile are skipped as ``busy``). They run on Ferret's partition
L* with its N worker slots as data-parallel replicas whose gradients join in the same flush (DAPPLE's
"pipelined data parallelism"), so they use the executors Ferret uses. No compensation unless asked
(the paper's Table "pipeline-ablation" applies none); gradients are never stale (τ = 0, validated).
See ``docs/schedules.md`` for the readings and :mod:`.flush_scheduler` for the rules.
"""

from __future__ import annotations

from ferret_core.engine.policies import PolicySetup
from ferret_core.engine.schedules.common import check_units, micro_batches, rows_from_slots, schedule_plan
from ferret_core.engine.schedules.flush_pipeline import FlushPipeline
from ferret_core.errors import ConfigError
from ferret_core.plan import Plan
from ferret_core.planning.memory_model import MemorySettings
from ferret_core.planning.schedule_memory import ScheduleShape
from ferret_core.profile import ModelProfile
from ferret_core.schedule.flush_scheduler import Device, Executor, FlushRules

_NO_COMPENSATOR = MemorySettings(variant="engine", compensator="none")


class _FlushSchedule:
    """A flush schedule over Ferret's plan: rows, devices and the B/W split come from the subclass."""

    name = ""
    split_backward = False

    def __init__(
        self,
        plan: Plan,
        *,
        flush_every: int | None = None,
        wait_slots: int = 1,
        input_share: float = 0.5,
        profile: ModelProfile | None = None,
        memory: MemorySettings = _NO_COMPENSATOR,
    ) -> None:
        self.plan = plan
        self.flush_every = micro_batches(plan, flush_every)
        self.wait_slots = wait_slots
        self.input_share = input_share
        self.profile = profile
        self.memory = memory

    def rows_per_slot(self) -> int:
        return 1

    def devices(self, rows: int, stages: int) -> dict[Executor, Device]:
        return {}

    def setup(self, model: str, num_units: int, arrival_interval: float) -> PolicySetup:
        check_units(self.plan, model, num_units)
        workers = rows_from_slots(self.plan, self.rows_per_slot())
        p = self.plan.num_stages
        rules = FlushRules(
            num_workers=len(workers),
            num_stages=p,
            flush_every=self.flush_every,
            rows_per_slot=self.rows_per_slot(),
            wait_slots=self.wait_slots,
            split_backward=self.split_backward,
            input_share=self.input_share,
            devices=self.devices(len(workers), p),
        )
        shape = ScheduleShape(True, workers, self.flush_every, self.split_backward, self.rows_per_slot())
        executed, planned = schedule_plan(self.plan, self.name, workers, shape, self.profile, self.memory)
        return PolicySetup(
            self.name, executed, rules, instant=False, planned=executed if planned else None,
            pipeline_type=FlushPipeline,
        )


class Dapple(_FlushSchedule):
    """DAPPLE (Fan et al., "DAPPLE: A Pipelined Data Parallel Approach for Training Large Models", PPoPP
    2021): 1F1B with a flush — stage j warms up with min(P − j, m) forwards, then alternates one backward
    and one forward (early backward scheduling), and applies the summed gradients of the m micro-batches
    of every data-parallel replica once per iteration (PipeDream-Flush is the same schedule)."""

    name = "dapple"


class ZeroBubble(_FlushSchedule):
    """Zero bubble (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024; sail-sg/zero-bubble), its
    handcrafted ZB-H1 schedule: each backward is split into B (input gradient, on the critical path) and
    W (weight gradient, deferred into what would be bubbles); at most P − j items in flight at stage j
    counting those whose W is pending, so its activation memory is 1F1B's. Priorities B > F > W; the
    optimizer step waits for every W of the group (we skip ZB's optimizer post-validation: a flush here
    is synchronous anyway). B takes ``input_share`` of t̂^b (½: ZB's T_B ≈ T_W), W the rest."""

    name = "zb"
    split_backward = True


class Hanayo(_FlushSchedule):
    """Hanayo (Liu et al., "Hanayo: Harnessing Wave-like Pipeline Parallelism for Enhanced Large Model
    Training Efficiency", SC 2023) with ``waves`` waves.

    Hanayo cuts the model into 2W·D chunks laid out on D devices in a zig-zag, so that data runs down
    and back up the devices W times; a device holds 2W chunks, none is duplicated, and the devices fill
    each other's bubbles. Our reading on L* (docs/schedules.md): the chunks cannot be finer than L*'s P
    stages (MNISTNet has 4 units), so a wave runs over *pipeline rows*: each of Ferret's N slots owns P
    devices that carry 2W rows of the P stages, even rows downwards (stage j on device j), odd rows
    upwards (stage j on device P−1−j) — the zig-zag of Chimera/Hanayo at stage granularity. A device
    runs one action at a time (B before F before W, oldest item first). A slot's pipeline still flushes
    every m micro-batches, like DAPPLE's, now spread over its rows, and all rows read the one version of
    their group (no weight copies): the waves change where micro-batches run, not how many an update
    sums. With m ≤ 2W some rows stay empty, so more waves change nothing once 2W ≥ m."""

    def __init__(self, plan: Plan, waves: int, **kwargs: object) -> None:
        if waves not in (1, 2, 3):
            raise ConfigError(f"Hanayo runs 1, 2 or 3 waves (hanayo-1w, -2w, -3w), got {waves}")
        super().__init__(plan, **kwargs)  # type: ignore[arg-type]
        self.waves = waves
        self.name = f"hanayo-{waves}w"

    def rows_per_slot(self) -> int:
        return 2 * self.waves

    def devices(self, rows: int, stages: int) -> dict[Executor, Device]:
        slots = rows // self.rows_per_slot()
        out: dict[Executor, Device] = {}
        for n in range(rows):
            r, slot = divmod(n, slots)  # row n = r·S + slot (see rows_from_slots)
            for j in range(stages):
                out[(n, j)] = (slot, j if r % 2 == 0 else stages - 1 - j)
        return out
