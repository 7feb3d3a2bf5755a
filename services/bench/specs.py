"""Declarative experiment specs: settings × arms × seeds, expanded into independent runs.

A :class:`Setting` is a data stream and a model (the paper's "MNIST/MNISTNet"); an :class:`Arm` is one
column of a table: a registered method at a budget (``M+``: no budget; ``M``: the measured bytes of
PipeDream-2BW on the same partition; ``M-``: the smallest budget at which the planner keeps M's
partition; ``sweep2``/``sweep4``: the points between them of the five-budget sweep of the pipelines
experiment, DESIGN §3.2), with an OCL
algorithm and a compensator. A :class:`RunSpec` is one process: an arm on a setting for one seed.
"""

from __future__ import annotations

from dataclasses import dataclass

BUDGET_LABELS: tuple[str, ...] = ("none", "M+", "M", "M-", "sweep2", "sweep4")
# the five budgets of the pipelines sweep, smallest first: M-, halfway to M, M, halfway to the planner's
# M+ bytes, M+
SWEEP_LABELS: tuple[str, ...] = ("M-", "sweep2", "M", "sweep4", "M+")
PLANNED_LABELS: frozenset[str] = frozenset(BUDGET_LABELS) - {"none"}
# the algorithms whose state is refreshed every so many trained items, and the simulate option that sets it
REFRESHED: dict[str, str] = {"lwf": "--lwf-every", "mas": "--mas-every"}


@dataclass(frozen=True)
class Setting:
    """A stream and a model: ``dataset`` and ``model`` as ``ferret simulate`` names them, the committed
    ``profile`` whose stage times drive the virtual clock (a path relative to the repository), and the SGD
    learning rate ``lr`` every method of the setting runs with (``ferret simulate --lr``)."""

    dataset: str
    model: str
    profile: str
    lr: float = 1e-3

    @property
    def id(self) -> str:
        return f"{self.dataset}/{self.model}"


@dataclass(frozen=True)
class Arm:
    """One column: ``method`` (a registry name) at ``budget`` (one of :data:`BUDGET_LABELS`; ``none`` for
    methods that do not plan), with ``algorithm`` and ``compensator`` (``None``: the method's default).
    ``fixed_plan``: run on the plan made with compensator ``none`` at that budget (the compensator
    ablation: every compensator on the same pipeline). ``objective``: what the planner maximises for a
    method that plans now (``rate``: R_F, the paper's; ``accuracy``: R_F discounted by the cost of
    staleness calibrated on the stream's head, docs/planner.md reading 13). ``refresh_every``: LwF's teacher and
    MAS's importance refresh period in trained items (``None``: the algorithm's default, 1000 and 100,
    sized for the paper's whole streams; a short stream trains fewer items than that, and the algorithm
    would never act)."""

    column: str
    method: str
    budget: str = "none"
    algorithm: str = "vanilla"
    compensator: str | None = None
    fixed_plan: bool = False
    refresh_every: int | None = None
    objective: str = "rate"  # the planner's objective for a method that plans now (``ferret simulate --objective``)

    def __post_init__(self) -> None:
        if self.budget not in BUDGET_LABELS:
            raise ValueError(f"budget {self.budget!r}: expected one of {', '.join(BUDGET_LABELS)}")

    @property
    def algorithm_id(self) -> str:
        """The algorithm with its refresh period when one is set (``mas-every10``): what M is measured
        under."""
        return self.algorithm if self.refresh_every is None else f"{self.algorithm}-every{self.refresh_every}"

    def algorithm_argv(self) -> list[str]:
        """The ``ferret simulate`` options of the arm's algorithm."""
        if self.algorithm == "vanilla":
            return []
        argv = ["--algorithm", self.algorithm]
        if self.refresh_every is not None and self.algorithm in REFRESHED:
            argv += [REFRESHED[self.algorithm], str(self.refresh_every)]
        return argv

    @property
    def label(self) -> str:
        """The column with its algorithm and compensator, unique within an experiment."""
        parts = [self.column]
        if self.algorithm != "vanilla":
            parts.append(self.algorithm_id)
        if self.compensator is not None:
            parts.append(self.compensator)
        if self.objective != "rate":
            parts.append(f"objective-{self.objective}")
        return "|".join(parts)


@dataclass(frozen=True)
class RunSpec:
    """One independent run: ``arm`` on ``setting`` for ``seed`` over ``items`` stream items; test
    accuracy on ``test_items`` evenly spaced test items (``None``: the whole test split)."""

    experiment: str
    setting: Setting
    arm: Arm
    seed: int
    items: int
    test_items: int | None = None

    @property
    def key(self) -> str:
        """What identifies the run in the CSV (``--resume`` skips keys it finds there)."""
        tests = "all" if self.test_items is None else self.test_items
        return (
            f"{self.experiment}|{self.setting.id}|lr{self.setting.lr:g}|{self.arm.label}|{self.arm.budget}|"
            f"{self.items}|{tests}|{self.seed}"
        )


@dataclass(frozen=True)
class ExperimentSpec:
    """An experiment as data: every arm on every setting for every seed."""

    name: str
    settings: tuple[Setting, ...]
    arms: tuple[Arm, ...]
    seeds: tuple[int, ...]
    items: int
    test_items: int | None = None

    def __post_init__(self) -> None:
        labels = [(a.label, a.budget) for a in self.arms]
        if len(set(labels)) != len(labels):
            raise ValueError(f"experiment {self.name!r}: two arms share a column, algorithm and compensator")
        if not self.settings or not self.arms or not self.seeds or self.items <= 0:
            raise ValueError(f"experiment {self.name!r}: needs settings, arms, seeds and items > 0")

    def expand(self) -> tuple[RunSpec, ...]:
        """Every run, settings outermost, seeds innermost (the order tables list them in)."""
        return tuple(
            RunSpec(self.name, setting, arm, seed, self.items, self.test_items)
            for setting in self.settings
            for arm in self.arms
            for seed in self.seeds
        )

    def methods(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(a.method for a in self.arms))

    def budgeted_algorithms(self) -> tuple[tuple[str, int | None], ...]:
        """The OCL algorithms (with their refresh periods) of the arms that run at a measured budget (M, M-,
        the sweep's points): M is measured per setting and algorithm."""
        planned = PLANNED_LABELS - {"M+"}
        return tuple(dict.fromkeys((a.algorithm, a.refresh_every) for a in self.arms if a.budget in planned))

    def budgeted_compensators(self, algorithm: str, refresh_every: int | None, default: str) -> tuple[str, ...]:
        """The compensators (``default`` where an arm names none) of the arms under ``algorithm`` that run
        at a measured budget: M- is bisected per compensator (its state is part of the planner's bytes)."""
        planned = PLANNED_LABELS - {"M+"}
        return tuple(
            dict.fromkeys(
                a.compensator or default
                for a in self.arms
                if a.budget in planned and (a.algorithm, a.refresh_every) == (algorithm, refresh_every)
            )
        )
