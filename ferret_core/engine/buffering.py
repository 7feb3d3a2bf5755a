"""Buffering baselines as policies over the one engine: Random-N and Last-N B-Skip, and Camel (DESIGN §2).

Ghunaim et al. (ICCV 2023, "Real-Time Evaluation in Online Continual Learning: A New Hope") evaluate a
learner against a stream that does not wait for it; the Ferret paper (Zhou et al., CVPR 2025, "Compared
methods") adds buffering baselines that "select a subset from the latest B unprocessed data using
Random-N, Last-N and Coreset sampler". Here, for all three:

* one sequential trainer on the whole model (one worker, one stage), as 1-Skip;
* every arrival is predicted at its arrival (online accuracy, DESIGN §3.1), then kept in a window of the
  newest B unprocessed items (``--bskip-window``); an item pushed out by a newer one is skipped as
  ``evicted``;
* when the trainer is free and the window holds at least N items (``--bskip-batch``), one mini-batch of
  N is drawn from it — at random (``random-n``), the newest N (``last-n``), or Camel's coreset
  (``camel``) — and trained as one step; the window's other items are skipped as ``not_selected``;
  items still waiting when the stream ends are skipped as ``stream_end``;
* a step of b items takes the profile's time for batch b (:meth:`ferret_core.profile.ModelProfile.layer_times`).

Camel (Li, Shen, Chen, SIGMOD 2022) also replays: its step is the weighted coreset of N plus R samples
(``--camel-replay``, default N) drawn from its buffer of past representative samples
(``--camel-buffer``, default 5000 as the paper's replay buffers), which then takes the coreset
(:mod:`ferret_core.engine.coreset` states what is simplified). A step whose loss or gradient is
non-finite evicts its blamed samples from that buffer again (the step's ``held`` rows; the engine
decides the blame, :meth:`ferret_core.engine.pipeline.Pipeline._count_non_finite`). The B-Skip window
needs no such care: it is emptied at every draw, so a sample is trained at most once. Camel brings its
own anti-forgetting component and, as in the paper, is not combined with the OCL algorithms.

Memory: :func:`buffering_bytes` is the byte model of what these methods hold (the plan's
``planned_bytes``); the engine measures the same things independently (the window and Camel's buffer
are a memory-meter source). Given a budget, a policy trains the largest mini-batch N (up to
``--bskip-batch``) whose predicted bytes fit it.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ferret_core.engine.coreset import RepresentativeBuffer, select_coreset
from ferret_core.engine.policies import PolicySetup, sequential_plan
from ferret_core.engine.steps import NO_FOOTPRINT, Batch, Fed, Feeder, Footprint
from ferret_core.errors import ConfigError, InfeasibleBudgetError, ScheduleError
from ferret_core.plan import Partition
from ferret_core.planning.cost_model import StageGeometry
from ferret_core.profile import ModelProfile, dtype_bytes
from ferret_core.schedule.scheduler import PlanRules

BUFFERING_METHODS: tuple[str, ...] = ("random-n", "last-n", "camel")
LABEL_BYTES = 8  # int64 labels of Camel's buffer
NN_BYTES = 8  # float32 nearest-neighbour distance + int32 index per Camel buffer slot


@dataclass(frozen=True)
class BufferingSettings:
    """``batch`` = N items per step, ``window`` = B newest unprocessed items kept, Camel's buffer
    capacity and replayed items per step (``None``: N), ``seed`` for the random draws."""

    batch: int = 10
    window: int = 50
    camel_buffer: int = 5000
    camel_replay: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.batch < 1:
            raise ConfigError(f"--bskip-batch must be >= 1, got {self.batch}")
        if self.window < self.batch:
            raise ConfigError(f"--bskip-window ({self.window}) must hold at least --bskip-batch ({self.batch}) items")
        if self.camel_buffer < 1:
            raise ConfigError(f"--camel-buffer must be >= 1, got {self.camel_buffer}")
        if self.camel_replay is not None and self.camel_replay < 0:
            raise ConfigError(f"--camel-replay must be >= 0, got {self.camel_replay}")

    @property
    def replay(self) -> int:
        return self.batch if self.camel_replay is None else self.camel_replay

    def step_batch(self, method: str) -> int:
        """Items per step once buffers are full: N, plus Camel's replayed items."""
        return self.batch + (self.replay if method == "camel" else 0)


class WindowFeeder:
    """The newest-B window of B-Skip; draws N at random (``random``) or the newest N (``last``)."""

    takes_algorithms = True

    def __init__(self, settings: BufferingSettings, draw: str) -> None:
        if draw not in ("random", "last"):
            raise ConfigError(f"draw must be 'random' or 'last', got {draw!r}")
        self.settings = settings
        self.draw = draw
        self._window: deque[tuple[int, Tensor, int]] = deque()
        self._generator = torch.Generator().manual_seed(settings.seed)

    def offer(self, index: int, x: Tensor, y: int) -> int:
        self._window.append((index, x, y))
        if len(self._window) > self.settings.window:
            self._window.popleft()
            return 1
        return 0

    def ready(self) -> bool:
        return len(self._window) >= self.settings.batch

    def _chosen_rows(self) -> list[int]:
        held, n = len(self._window), self.settings.batch
        if self.draw == "last":
            return list(range(held - n, held))
        return sorted(torch.randperm(held, generator=self._generator)[:n].tolist())

    def take(self) -> Fed:
        if not self.ready():
            raise ScheduleError(
                f"a step needs {self.settings.batch} items, the window holds {len(self._window)}; take() only "
                "when ready()"
            )
        rows = self._chosen_rows()
        chosen = [self._window[r] for r in rows]
        left = len(self._window) - len(chosen)
        self._window.clear()
        batch = Batch.stack([x for _, x, _ in chosen], [y for _, _, y in chosen])
        return Fed(batch, max(i for i, _, _ in chosen), left)

    def drop_all(self) -> int:
        held = len(self._window)
        self._window.clear()
        return held

    def state_tensors(self) -> Iterator[Tensor]:
        for _, x, _ in list(self._window):
            yield x

    def state_dict(self) -> dict[str, Any]:
        return {
            "window": [(i, x.clone(), y) for i, x, y in self._window],
            "generator": self._generator.get_state(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._window = deque((int(i), x.clone(), int(y)) for i, x, y in state["window"])
        self._generator.set_state(state["generator"])


class CamelFeeder(WindowFeeder):
    """Camel's step: the window's greedy coreset of N (weighted by the share of the window each covers)
    plus R samples replayed from its representative buffer, which then takes the coreset. Not combined
    with an OCL algorithm: Camel brings its own anti-forgetting buffer (the paper: "cannot be integrated")."""

    takes_algorithms = False

    def __init__(self, settings: BufferingSettings) -> None:
        super().__init__(settings, "last")
        self.buffer = RepresentativeBuffer(settings.camel_buffer, seed=settings.seed)

    def take(self) -> Fed:
        if not self.ready():
            raise ScheduleError(
                f"a step needs {self.settings.batch} items, the window holds {len(self._window)}; take() only "
                "when ready()"
            )
        items = list(self._window)
        self._window.clear()
        window = Batch.stack([x for _, x, _ in items], [y for _, _, y in items])
        rows, weights = select_coreset(window.x, window.y, self.settings.batch)
        replay_x, replay_y, replay_held = self.buffer.sample(self.settings.replay)
        new, old = len(rows), int(replay_y.shape[0])
        share = new / (new + old)
        x = window.x[rows] if old == 0 else torch.cat([window.x[rows], replay_x])
        y = window.y[rows] if old == 0 else torch.cat([window.y[rows], replay_y])
        step_weights = torch.cat([weights * share, torch.full((old,), (1 - share) / max(old, 1))])
        held = tuple(self.buffer.add(window.x[r], int(window.y[r])) for r in rows) + replay_held
        batch = Batch(x, y, step_weights, replayed=old, held=held)
        return Fed(batch, max(items[r][0] for r in rows), len(items) - new)

    def state_tensors(self) -> Iterator[Tensor]:
        yield from super().state_tensors()
        yield from self.buffer.state_tensors()

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "buffer": self.buffer.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self.buffer.load_state_dict(state["buffer"])


def buffering_bytes(
    profile: ModelProfile, method: str, settings: BufferingSettings, footprint: Footprint = NO_FOOTPRINT
) -> int:
    """Bytes a buffering method holds (its plan's ``planned_bytes``), in the profile's dtype, at the
    points the engine's memory meter samples (after each action):

    * ΣW: the master (the one worker's replica is the master itself);
    * the larger of the step's gradient ΣW (held from its backward until the update) and the step's
      forward state — for b items (N, plus Camel's or the algorithm's replayed items): autograd's saved
      tensors b·Σ saved_l, the input b·|x| and the output b·classes (freed by the backward, before its
      gradient is sampled);
    * the window: B·|x|; Camel's buffer: capacity·(|x| + label + nearest-neighbour bookkeeping);
    * an OCL algorithm's ``footprint`` when combined: its replay buffer (items·|x|) and its copies of the
      weights (LwF's teacher ΣW, MAS's importances and anchor 2ΣW).
    """
    if method not in BUFFERING_METHODS:
        raise ConfigError(f"unknown buffering method {method!r}: expected one of {', '.join(BUFFERING_METHODS)}")
    unit = dtype_bytes(profile.dtype)
    geometry = StageGeometry.from_profile(profile, Partition((0, profile.num_units)))
    weights, x = geometry.total_weights, profile.input_elements
    b = settings.step_batch(method) + footprint.replayed(settings.batch)
    step = b * (geometry.saved[0] + x + profile.layers[-1].activations)
    elements = (1 + footprint.weight_copies) * weights + max(weights, step)
    elements += settings.window * x + footprint.replay_items * x
    total = elements * unit
    if method == "camel":
        total += settings.camel_buffer * (x * 4 + LABEL_BYTES + NN_BYTES)
    return total


def fit_batch(
    profile: ModelProfile, method: str, settings: BufferingSettings, budget: int, footprint: Footprint = NO_FOOTPRINT
) -> BufferingSettings:
    """``settings`` with the largest N ≤ ``settings.batch`` whose :func:`buffering_bytes` fit ``budget`` and
    whose step (N, plus replayed items) the profile times (the window grows to N when smaller);
    :class:`InfeasibleBudgetError` when N = 1 does not fit."""
    largest_step = profile.batch_sizes[-1]
    for n in range(settings.batch, 0, -1):
        candidate = dataclasses.replace(settings, batch=n, window=max(settings.window, n))
        if candidate.step_batch(method) + footprint.replayed(n) > largest_step and n > 1:
            continue
        if buffering_bytes(profile, method, candidate, footprint) <= budget:
            return candidate
    minimum = buffering_bytes(profile, method, dataclasses.replace(settings, batch=1), footprint)
    raise InfeasibleBudgetError(budget, minimum)


class BufferingPolicy:
    """A buffering method (see the module docstring): ``random-n`` / ``last-n`` B-Skip (Ghunaim et al.,
    ICCV 2023, and the Ferret paper's baselines) or ``camel`` (Li, Shen, Chen, SIGMOD 2022). With a
    ``profile`` its plan reports :func:`buffering_bytes` (with the OCL algorithm's ``footprint``); with a
    ``budget`` too, N is fitted to it."""

    def __init__(
        self,
        name: str,
        settings: BufferingSettings | None = None,
        *,
        profile: ModelProfile | None = None,
        budget: int | None = None,
        footprint: Footprint = NO_FOOTPRINT,
    ) -> None:
        if name not in BUFFERING_METHODS:
            raise ConfigError(f"unknown buffering method {name!r}: expected one of {', '.join(BUFFERING_METHODS)}")
        settings = settings or BufferingSettings()
        if budget is not None:
            if profile is None:
                raise ConfigError(f"method {name!r} fits its mini-batch to a budget from the profile: pass profile=")
            settings = fit_batch(profile, name, settings, budget, footprint)
        self.name = name
        self.footprint = footprint
        self.settings = settings
        self.profile = profile
        self.budget = budget

    def feeder(self) -> Feeder:
        if self.name == "camel":
            return CamelFeeder(self.settings)
        return WindowFeeder(self.settings, "random" if self.name == "random-n" else "last")

    def setup(self, model: str, num_units: int, arrival_interval: float) -> PolicySetup:
        plan = sequential_plan(model, num_units, arrival_interval)
        planned = None
        if self.profile is not None:
            planned = dataclasses.replace(
                plan,
                planned_bytes=buffering_bytes(self.profile, self.name, self.settings, self.footprint),
                budget_bytes=self.budget,
                memory_model="buffering",
                dtype=self.profile.dtype,
            )
        rules = PlanRules(plan, wait_slots=0)
        return PolicySetup(self.name, plan, rules, instant=False, planned=planned, feeder=self.feeder())
