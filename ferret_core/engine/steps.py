"""What one admitted unit of work trains, and the few typed hooks that shape it (DESIGN §2: every method
and OCL algorithm is a policy over the one engine; STYLE lesson 7: small algorithms over a few hooks).

A :class:`TrainingStep` is what the pipeline carries through its stages for one admitted arrival: a
:class:`Batch` of samples (one stream item, a B-Skip mini-batch, or either plus replayed items), the loss
its last stage back-propagates, how many *stream* items it trains (counted in ``trained``), and its
:class:`StepShape` — what it costs on the virtual clock.

Two hooks, each with one job:

* :class:`Algorithm` (an OCL algorithm, :mod:`ferret_core.ocl`): ``step(new)`` turns the admitted samples
  into the step (ER/MIR append replayed items, LwF adds a distillation term to the loss, MAS refreshes its
  importances), ``regularise(stage, θ, g, count)`` adds a penalty gradient at a stage's update (MAS), and
  ``state_tensors()`` shows its state to the memory meter. ``bind(view)`` hands it a :class:`ModelView` of
  the master (logits and whole-model gradients on the current or a remembered version).
* :class:`Feeder` (a buffering method, :mod:`ferret_core.engine.buffering`): holds arrivals until the
  trainer is free, then hands over a mini-batch (``take``); what it drops is counted as skipped.

:class:`PlainSteps` is the engine's default algorithm (``vanilla``): the admitted samples, mean
cross-entropy, no state.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from ferret_core.engine.versions import StageVersion
from ferret_core.errors import ConfigError
from ferret_core.schedule.step_shape import UNIT_STEP, StepShape

LossFn = Callable[[Tensor], Tensor]  # the last stage's output (b, classes) → a scalar loss


@dataclass(frozen=True)
class Footprint:
    """What an OCL algorithm adds to a method's memory and steps, for byte models and planning:
    ``replay_items`` buffered samples, ``replay_batch`` samples added to each step once the buffer is full
    (``None`` with a buffer: as many as the step's admitted samples), and extra copies of the weights ΣW
    (LwF's teacher: 1; MAS's importances and anchor: 2)."""

    replay_items: int = 0
    replay_batch: int | None = None
    teacher_copy: bool = False
    importances: bool = False

    @property
    def weight_copies(self) -> int:
        return int(self.teacher_copy) + 2 * int(self.importances)

    def replayed(self, new: int) -> int:
        """Samples replayed in a step of ``new`` admitted samples (buffer full)."""
        if not self.replay_items:
            return 0
        return new if self.replay_batch is None else self.replay_batch


NO_FOOTPRINT = Footprint()


class Evicting(Protocol):
    """A buffer that keeps samples across steps (ER/MIR's reservoir, Camel's representative buffer) and
    can give one up again."""

    def evict(self, slot: int, stamp: int) -> bool:
        """Remove the sample that took ``slot`` with ``stamp`` (wherever it has moved since); False when it
        is no longer held."""
        ...


@dataclass(frozen=True, slots=True)
class Held:
    """Where a step's sample is kept for later steps: its ``buffer``, the ``slot`` it took and that
    insertion's ``stamp`` (unique per buffer), so that a step whose loss or gradient turns out non-finite
    can evict the sample instead of replaying it in every later step."""

    buffer: Evicting
    slot: int
    stamp: int


@dataclass(frozen=True, eq=False)
class Batch:
    """Samples to train on: ``x`` (b, *shape), ``y`` (b,) int64 class labels, optional per-sample loss
    ``weights`` (b,) summing to 1 (Camel's coreset weights; ``None``: the mean), how many of the rows,
    the last ones, are ``replayed`` from a buffer rather than stream items, and per row where a buffer
    keeps that sample (``held``: empty, or one :class:`Held` or ``None`` per row)."""

    x: Tensor
    y: Tensor
    weights: Tensor | None = None
    replayed: int = 0
    held: tuple[Held | None, ...] = ()

    def __post_init__(self) -> None:
        if self.x.shape[0] != self.y.shape[0] or self.y.dim() != 1:
            raise ConfigError(
                f"a batch needs x (b, ...) and y (b,), got {tuple(self.x.shape)} and {tuple(self.y.shape)}"
            )
        if self.weights is not None and self.weights.shape != self.y.shape:
            raise ConfigError(f"batch weights must have shape {tuple(self.y.shape)}, got {tuple(self.weights.shape)}")
        if self.held and len(self.held) != self.y.shape[0]:
            raise ConfigError(
                f"a batch of {self.y.shape[0]} rows needs no held entries or one per row, got {len(self.held)}"
            )

    def __len__(self) -> int:
        return int(self.y.shape[0])

    @property
    def stream_items(self) -> int:
        """Rows that are stream items (counted as trained)."""
        return len(self) - self.replayed

    @classmethod
    def single(cls, x: Tensor, y: int) -> Batch:
        """One stream item (``x`` without batch dimension)."""
        return cls(x.unsqueeze(0), torch.tensor([y], dtype=torch.long))

    @classmethod
    def stack(cls, xs: Sequence[Tensor], ys: Sequence[int], weights: Tensor | None = None) -> Batch:
        return cls(torch.stack(list(xs)), torch.tensor(list(ys), dtype=torch.long), weights)

    def with_replay(self, replay: Batch) -> Batch:
        """``self``'s samples then ``replay``'s, counted as replayed (unweighted batches only)."""
        if self.weights is not None or replay.weights is not None:
            raise ConfigError("weighted batches (Camel) are not combined with an algorithm's replayed items")
        x = torch.cat([self.x, replay.x.to(self.x.device)])
        y = torch.cat([self.y, replay.y.to(self.y.device)])
        held = self.held_rows() + replay.held_rows() if self.held or replay.held else ()
        return Batch(x, y, replayed=self.replayed + len(replay), held=held)

    def held_rows(self) -> tuple[Held | None, ...]:
        """:attr:`held`, one entry per row (``None`` where no buffer keeps the row)."""
        return self.held or (None,) * len(self)

    def holding(self, held: tuple[Held | None, ...]) -> Batch:
        """The same samples with ``held`` in place of :attr:`held`."""
        return Batch(self.x, self.y, self.weights, self.replayed, held)


def cross_entropy(batch: Batch) -> LossFn:
    """Mean cross-entropy of the batch (weighted by ``batch.weights`` when given)."""
    y, weights = batch.y, batch.weights

    def loss(output: Tensor) -> Tensor:
        target = y.to(output.device)
        if weights is None:
            return F.cross_entropy(output, target)
        per_item = F.cross_entropy(output, target, reduction="none")
        return (per_item * weights.to(output.device, output.dtype)).sum()

    return loss


@dataclass(frozen=True, eq=False)
class TrainingStep:
    """One admitted unit of work: ``batch`` goes through the stages, the last stage back-propagates
    ``loss``; ``samples`` of its rows are stream items (the others replayed)."""

    batch: Batch
    loss: LossFn
    samples: int
    shape: StepShape = field(default=UNIT_STEP)

    @classmethod
    def plain(cls, batch: Batch) -> TrainingStep:
        return cls(batch, cross_entropy(batch), batch.stream_items, StepShape(batch=len(batch)))


class ModelView(Protocol):
    """The master model as an algorithm may use it (whole-model passes outside the pipeline's executors;
    their virtual time is the step's ``overhead``)."""

    @property
    def lr(self) -> float: ...

    def masters(self) -> tuple[StageVersion, ...]:
        """The current master version of every stage (immutable: holding them keeps that version)."""
        ...

    def logits(self, x: Tensor, versions: Sequence[StageVersion] | None = None) -> Tensor:
        """The model's output for ``x`` (b, ...) on ``versions`` (default the masters), without autograd."""
        ...

    def gradients(
        self, x: Tensor, objective: Callable[[Tensor], Tensor], versions: Sequence[StageVersion] | None = None
    ) -> list[tuple[Tensor, ...]]:
        """∂ objective(model(x)) / ∂θ per stage (parameter order of each stage's version)."""
        ...


class Algorithm(Protocol):
    """An OCL algorithm over the engine (see the module docstring)."""

    @property
    def name(self) -> str: ...

    @property
    def footprint(self) -> Footprint: ...

    def steady_shape(self, new: int) -> StepShape:
        """The usual step's shape for ``new`` admitted samples once the algorithm's buffers are full
        (what the planner plans with; periodic passes such as MAS's importance refresh left out)."""
        ...

    def bind(self, view: ModelView) -> None: ...

    def step(self, new: Batch) -> TrainingStep:
        """The step that trains the admitted samples ``new`` (called once per admission, in arrival order)."""
        ...

    def regularise(self, stage: int, params: Sequence[Tensor], grads: list[Tensor], count: int) -> list[Tensor]:
        """The gradient a stage's update applies, given the summed loss gradient of ``count`` steps."""
        ...

    def state_tensors(self) -> Iterator[Tensor]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


class PlainSteps:
    """``vanilla``: train the admitted samples as they are (mean cross-entropy), no state."""

    name = "vanilla"
    footprint = NO_FOOTPRINT

    def steady_shape(self, new: int) -> StepShape:
        return StepShape(batch=new)

    def bind(self, view: ModelView) -> None:
        return None

    def step(self, new: Batch) -> TrainingStep:
        return TrainingStep.plain(new)

    def regularise(self, stage: int, params: Sequence[Tensor], grads: list[Tensor], count: int) -> list[Tensor]:
        return grads

    def state_tensors(self) -> Iterator[Tensor]:
        return iter(())

    def state_dict(self) -> dict[str, Any]:
        return {"name": self.name}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("name") != self.name:
            raise ConfigError(f"state of algorithm {state.get('name')!r} cannot be loaded into {self.name!r}")


@dataclass(frozen=True, eq=False)
class Fed:
    """A mini-batch a feeder hands over: its samples, the step's item number (the newest sample's stream
    index) and how many buffered items were dropped as not selected."""

    batch: Batch
    index: int
    not_selected: int


class Feeder(Protocol):
    """A buffering method's arrival buffer (see the module docstring). ``takes_algorithms``: whether an
    OCL algorithm may be combined with it (Camel's own buffer: no, as in the paper)."""

    takes_algorithms: bool

    def offer(self, index: int, x: Tensor, y: int) -> int:
        """Buffer a labelled arrival; returns how many buffered items it pushed out (skipped as evicted)."""
        ...

    def ready(self) -> bool:
        """Whether a mini-batch can be taken now."""
        ...

    def take(self) -> Fed: ...

    def drop_all(self) -> int:
        """Empty the buffer at the end of the stream; returns how many items it held."""
        ...

    def state_tensors(self) -> Iterator[Tensor]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...
