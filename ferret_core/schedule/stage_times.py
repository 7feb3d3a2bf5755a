"""How long each stage's forward and backward take for one step: the virtual clock's durations and the
planner's t̂^f, t̂^b summed per stage (from a profile and a partition; plain data, no torch)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ferret_core.errors import ConfigError
from ferret_core.plan import Partition
from ferret_core.profile import ModelProfile
from ferret_core.schedule.actions import Action, Kind
from ferret_core.schedule.step_shape import UNIT_STEP, StepShape

PerBatch = Callable[[int], tuple[tuple[float, ...], tuple[float, ...]]]


@dataclass(frozen=True)
class StageTimes:
    """Σt̂^f and Σt̂^b of each stage, in the profile's time unit, for one item; ``per_batch(b)`` gives
    them for a step of b items (``None``: only single items are known)."""

    forward: tuple[float, ...]
    backward: tuple[float, ...]
    per_batch: PerBatch | None = field(default=None, compare=False, repr=False)
    _cache: dict[int, tuple[tuple[float, ...], tuple[float, ...]]] = field(
        default_factory=dict, init=False, compare=False, repr=False
    )

    @classmethod
    def from_profile(cls, profile: ModelProfile, partition: Partition) -> StageTimes:
        if profile.num_units != partition.num_units:
            raise ConfigError(
                f"profile of {profile.model!r} has {profile.num_units} units, the partition covers "
                f"{partition.num_units}; use the profile of the model being run"
            )

        def per_batch(batch: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
            times = profile.layer_times(batch)
            return (
                tuple(sum(times[u][0] for u in stage) for stage in partition.stages),
                tuple(sum(times[u][1] for u in stage) for stage in partition.stages),
            )

        return cls(
            tuple(sum(profile.layers[u].t_f for u in stage) for stage in partition.stages),
            tuple(sum(profile.layers[u].t_b for u in stage) for stage in partition.stages),
            per_batch,
        )

    @classmethod
    def instant(cls, num_stages: int) -> StageTimes:
        """Every action takes no time (Oracle: each item is trained before the next arrives)."""
        zeros = (0.0,) * num_stages
        return cls(zeros, zeros, lambda batch: (zeros, zeros))

    def at_batch(self, batch: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """(Σt̂^f, Σt̂^b) per stage of a step of ``batch`` items."""
        if batch == 1:
            return self.forward, self.backward
        times = self._cache.get(batch)
        if times is None:
            if self.per_batch is None:
                raise ConfigError(
                    f"stage times for a step of {batch} items are unknown: build StageTimes.from_profile with a "
                    "profile that has batch_times (`ferret profile --batch-sizes ...`)"
                )
            times = self._cache[batch] = self.per_batch(batch)
        return times

    def duration(self, action: Action, recompute: bool, shape: StepShape = UNIT_STEP) -> tuple[float, float]:
        """(R part, whole duration) of ``action`` for a step of ``shape``; the R part is 0 without
        recomputation."""
        forward, backward = self.at_batch(shape.batch)
        j = action.stage
        if action.kind is Kind.F:
            extra = self.overhead(shape) if j == 0 else 0.0
            return 0.0, extra + shape.forward_passes * forward[j]
        r = forward[j] if recompute else 0.0
        return r, r + backward[j]

    def overhead(self, shape: StepShape) -> float:
        """Time of the step's whole-model overhead passes."""
        total = 0.0
        for batch, with_backward in shape.overhead:
            forward, backward = self.at_batch(batch)
            total += sum(forward) + (sum(backward) if with_backward else 0.0)
        return total
