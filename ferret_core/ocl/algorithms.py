"""ER, MIR, LwF and MAS as :class:`~ferret_core.engine.steps.Algorithm` hooks over the engine.

Each composes with every method (docs/ocl.md): ``step`` shapes what an admitted arrival trains — on a
P-stage, N-worker pipeline the step's micro-batch (the item plus replayed items) goes through the stages
like a single item — and ``regularise`` shapes each stage's update. The buffers and copies they keep are
their ``state_tensors`` (a memory-meter source) and their :class:`~ferret_core.engine.steps.Footprint`
(what the byte models count, DESIGN §3.8). The math is in :mod:`ferret_core.ocl.losses`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from ferret_core.engine.steps import Batch, Footprint, ModelView, PlainSteps, TrainingStep, cross_entropy
from ferret_core.engine.versions import StageVersion
from ferret_core.errors import ConfigError
from ferret_core.ocl.losses import (
    decayed_importance,
    distillation_loss,
    interference,
    mas_penalty_gradient,
    output_norm,
    per_sample_cross_entropy,
)
from ferret_core.ocl.reservoir import ReservoirBuffer
from ferret_core.ocl.settings import AlgorithmSettings
from ferret_core.schedule.step_shape import StepShape


class _Stateless(PlainSteps):
    """Shared plumbing: a bound model view, no regulariser."""

    def bind(self, view: ModelView) -> None:
        self.view = view

    def _check_state(self, state: Mapping[str, Any]) -> None:
        if state.get("name") != self.name:
            raise ConfigError(f"state of algorithm {state.get('name')!r} cannot be loaded into {self.name!r}")


class ExperienceReplay(_Stateless):
    """ER (Chaudhry et al., 2019, "On Tiny Episodic Memories in Continual Learning"): each step trains the
    admitted samples plus ``replay_batch`` samples (default: as many as admitted, the paper's equal
    incoming and memory batches) drawn uniformly from a reservoir buffer of
    ``buffer_size`` (5000, the paper's setting) past samples; the buffer then takes the admitted samples
    (:class:`~ferret_core.ocl.reservoir.ReservoirBuffer`). Only samples a method admits for training enter
    the buffer (a skipped item was never processed); a sample whose step's loss or gradient turns out
    non-finite is evicted again (the step's ``held`` rows), so it is never replayed."""

    name = "er"

    def __init__(self, settings: AlgorithmSettings) -> None:
        self.settings = settings
        self.buffer = ReservoirBuffer(settings.buffer_size, seed=settings.seed)

    @property
    def footprint(self) -> Footprint:  # type: ignore[override]
        return Footprint(replay_items=self.settings.buffer_size, replay_batch=self.settings.replay_batch)

    def steady_shape(self, new: int) -> StepShape:
        return StepShape(batch=new + self.settings.replayed(new))

    def _replayed(self, new: Batch) -> tuple[Batch | None, tuple[tuple[int, bool], ...]]:
        """The replayed samples (drawn before the buffer takes ``new``) and the passes they cost."""
        return self.buffer.sample(self.settings.replayed(len(new))), ()

    def step(self, new: Batch) -> TrainingStep:
        replay, overhead = self._replayed(new)
        new = new.holding(self.buffer.add(new))  # evicted again if the step turns out non-finite
        batch = new if replay is None else new.with_replay(replay)
        shape = StepShape(batch=len(batch), overhead=overhead)
        return TrainingStep(batch, cross_entropy(batch), new.stream_items, shape)

    def state_tensors(self) -> Iterator[Tensor]:
        return self.buffer.state_tensors()

    def state_dict(self) -> dict[str, Any]:
        return {"name": self.name, "buffer": self.buffer.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._check_state(state)
        self.buffer.load_state_dict(state["buffer"])


class MaximallyInterferedRetrieval(ExperienceReplay):
    """MIR (Aljundi et al., NeurIPS 2019, "Online Continual Learning with Maximally Interfered
    Retrieval"): like ER, but the replayed samples are, of ``mir_candidates`` (default five times the
    replayed samples, the paper's 50 for 10) drawn uniformly from the buffer, those whose loss would
    rise most after a virtual SGD step on the admitted samples: θ_v = θ − lr·∇L(new; θ),
    rise = L(c; θ_v) − L(c; θ). Computed on the master, outside the pipeline's executors; on the virtual
    clock the worker pays for it before its stage-0 forward (a whole-model forward and backward of the
    admitted samples and two forwards of the candidates). The virtual weights are a transient the
    memory meter does not sample (as every transient inside an action)."""

    name = "mir"

    def steady_shape(self, new: int) -> StepShape:
        c = self.settings.candidates(new)
        return StepShape(batch=new + self.settings.replayed(new), overhead=((new, True), (c, False), (c, False)))

    def _replayed(self, new: Batch) -> tuple[Batch | None, tuple[tuple[int, bool], ...]]:
        pool = self.buffer.sample(self.settings.candidates(len(new)))
        if pool is None:
            return None, ()
        view = self.view
        masters = view.masters()
        grads = view.gradients(new.x, cross_entropy(new), masters)
        virtual = [
            StageVersion(v.stage, -1, tuple(torch.sub(p, g, alpha=view.lr) for p, g in zip(v.params, gs, strict=True)),
                         v.buffers)
            for v, gs in zip(masters, grads, strict=True)
        ]
        del grads
        pre = per_sample_cross_entropy(view.logits(pool.x, masters), pool.y)
        post = per_sample_cross_entropy(view.logits(pool.x, virtual), pool.y)
        del virtual
        chosen = interference(pre.cpu(), post.cpu(), self.settings.replayed(len(new)))
        c = len(pool)
        held = tuple(pool.held[i] for i in chosen.tolist()) if pool.held else ()
        return Batch(pool.x[chosen], pool.y[chosen], held=held), ((len(new), True), (c, False), (c, False))


class LearningWithoutForgetting(_Stateless):
    """LwF (Li & Hoiem, 2017, "Learning without Forgetting"), task-free: a teacher copy of the model,
    refreshed to the current master every ``lwf_every`` trained stream items, adds to each step's loss
    α·KL(softmax(teacher/T) ‖ softmax(model/T)) over the classes the teacher had seen (Avalanche's
    ``LwFPlugin``: α = 1, T = 2). The teacher is the master's versions at the refresh — immutable, so
    holding them *is* the copy (ΣW once the master moves on). Its logits are computed at admission; on
    the virtual clock every stage's forward runs twice (teacher beside student) once a teacher exists."""

    name = "lwf"

    def __init__(self, settings: AlgorithmSettings) -> None:
        self.settings = settings
        self._teacher: tuple[StageVersion, ...] | None = None
        self._teacher_classes: Tensor | None = None
        self._seen = torch.zeros(0, dtype=torch.bool)
        self._since = 0

    @property
    def footprint(self) -> Footprint:  # type: ignore[override]
        return Footprint(teacher_copy=True)

    def steady_shape(self, new: int) -> StepShape:
        return StepShape(batch=new, forward_passes=2)

    def step(self, new: Batch) -> TrainingStep:
        if self._since >= self.settings.lwf_every:
            self._teacher = self.view.masters()
            self._teacher_classes = torch.nonzero(self._seen).flatten()
            self._since = 0
        self._since += new.stream_items
        top = int(new.y.max()) + 1
        if top > self._seen.numel():
            self._seen = torch.cat([self._seen, torch.zeros(top - self._seen.numel(), dtype=torch.bool)])
        self._seen[new.y] = True
        if self._teacher is None or self._teacher_classes is None or self._teacher_classes.numel() == 0:
            return TrainingStep.plain(new)
        teacher = self.view.logits(new.x, self._teacher)
        classes = self._teacher_classes
        base = cross_entropy(new)
        alpha, temperature = self.settings.lwf_alpha, self.settings.lwf_temperature

        def loss(output: Tensor) -> Tensor:
            return base(output) + alpha * distillation_loss(output, teacher, temperature, classes.to(output.device))

        return TrainingStep(new, loss, new.stream_items, StepShape(batch=len(new), forward_passes=2))

    def state_tensors(self) -> Iterator[Tensor]:
        for version in self._teacher or ():
            yield from version.tensors()

    def state_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "teacher": _versions_state(self._teacher),
            "teacher_classes": self._teacher_classes,
            "seen": self._seen.clone(),
            "since": self._since,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._check_state(state)
        self._teacher = _versions_from_state(state["teacher"])
        self._teacher_classes = state["teacher_classes"]
        self._seen = state["seen"].clone()
        self._since = int(state["since"])


class MemoryAwareSynapses(_Stateless):
    """MAS (Aljundi et al., ECCV 2018, "Memory Aware Synapses"), with importances updated online (the
    task-free reading of Aljundi, Kelchtermans & Tuytelaars, CVPR 2019; Avalanche's ``MASPlugin`` decay):
    every ``mas_every`` trained stream items, the gradient of the squared L2 norm of the model's output
    on the step's samples gives Ω ← α·Ω + (1 − α)·|∇| (α = ``mas_alpha``) and the anchor θ* becomes the
    current master. Each stage's update adds 2λ·Ω ⊙ (θ − θ*) per step it applies (λ = ``mas_lambda``),
    the gradient of λ·ΣΩ(θ − θ*)². The importance pass runs on the master at admission; on the virtual
    clock the worker pays a whole-model forward and backward of the step before its stage-0 forward."""

    name = "mas"

    def __init__(self, settings: AlgorithmSettings) -> None:
        self.settings = settings
        self._importance: list[tuple[Tensor, ...]] | None = None
        self._anchor: tuple[StageVersion, ...] | None = None
        self._since = 0

    @property
    def footprint(self) -> Footprint:  # type: ignore[override]
        return Footprint(importances=True)

    def step(self, new: Batch) -> TrainingStep:
        self._since += new.stream_items
        if self._since < self.settings.mas_every:
            return TrainingStep.plain(new)
        self._since = 0
        masters = self.view.masters()
        grads = self.view.gradients(new.x, output_norm, masters)
        old = self._importance
        decay = self.settings.mas_alpha
        self._importance = [
            tuple(decayed_importance(None if old is None else old[j][k], g, decay) for k, g in enumerate(gs))
            for j, gs in enumerate(grads)
        ]
        self._anchor = masters
        shape = StepShape(batch=len(new), overhead=((len(new), True),))
        return TrainingStep(new, cross_entropy(new), new.stream_items, shape)

    def regularise(self, stage: int, params: Sequence[Tensor], grads: list[Tensor], count: int) -> list[Tensor]:
        importance, anchor = self._importance, self._anchor
        if importance is None or anchor is None:
            return grads
        strength = self.settings.mas_lambda * count
        return [
            g + mas_penalty_gradient(omega, p, a, strength)
            for g, omega, p, a in zip(grads, importance[stage], params, anchor[stage].params, strict=True)
        ]

    def state_tensors(self) -> Iterator[Tensor]:
        for stage in self._importance or ():
            yield from stage
        for version in self._anchor or ():
            yield from version.tensors()

    def state_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "importance": None if self._importance is None else [[t.clone() for t in s] for s in self._importance],
            "anchor": _versions_state(self._anchor),
            "since": self._since,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._check_state(state)
        raw = state["importance"]
        self._importance = None if raw is None else [tuple(t.clone() for t in s) for s in raw]
        self._anchor = _versions_from_state(state["anchor"])
        self._since = int(state["since"])


def _versions_state(versions: Sequence[StageVersion] | None) -> list[dict[str, Any]] | None:
    if versions is None:
        return None
    return [
        {"stage": v.stage, "version": v.version, "params": [p.clone() for p in v.params],
         "buffers": [b.clone() for b in v.buffers]}
        for v in versions
    ]


def _versions_from_state(state: Sequence[Mapping[str, Any]] | None) -> tuple[StageVersion, ...] | None:
    if state is None:
        return None
    return tuple(
        StageVersion(int(s["stage"]), int(s["version"]), tuple(s["params"]), tuple(s["buffers"])) for s in state
    )
