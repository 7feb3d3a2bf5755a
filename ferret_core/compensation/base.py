"""The compensator contract: one object per pipeline stage that corrects stale gradients.

The engine keeps one :class:`StageCompensator` per stage (state is per stage: λ may differ per stage,
DESIGN §3.3) and drives it with two calls, serialised per stage under the lock that guards the master:

* after every update of the master stage, :meth:`StageCompensator.observe_update` with
  ``delta = θ_new − θ_old`` of each parameter (the stage's master version counter advances by one);
* before applying a gradient ``g`` computed on version ``v_read`` while the master is at ``v_now``,
  :meth:`StageCompensator.compensate` with staleness ``τ = v_now − v_read ≥ 0``, the parameters of both
  versions, and it applies the returned gradient. Gradients are compensated one item at a time.

Contract kept by every compensator: ``τ = 0`` returns ``g`` itself (identity, DESIGN §3.3 / STYLE
lesson 5); inputs are never mutated (the output may *be* an input tensor when nothing changes); no host
synchronisation happens in ``compensate``/``observe_update`` (statistics are accumulated on the stage's
device and read by :meth:`StageCompensator.stats`).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from ferret_core.compensation.ring import DeltaRing
from ferret_core.errors import ConfigError, NotImplementedFeatureError

_TINY = 1e-30  # floor of ‖g_0‖ in the relative correction (a zero gradient has zero correction)


@dataclass(frozen=True)
class CompensatorSettings:
    """Hyper-parameters of every compensator (DESIGN §3.3, §3.11).

    ``lambda0``: λ⁰ of Alg. 1 (paper: 0.2). ``eta_lambda``: step size of λ's gradient descent, the
    paper's "μ"; 0 fixes λ = λ⁰ and allocates no v_r/v_a. ``alpha``: EMA coefficient of v_r, v_a (and of
    Gap-Aware's average step C). ``nu``: ℓ2 weight on λ in eq. lambda-objective-v1. ``fisher_lambda``:
    the manual λ of the one-shot Fisher compensator. ``gap_eps``: floor added to Gap-Aware's C.
    ``dc_lambda0``, ``dc_momentum``, ``dc_eps``: λ₀, the mean square's momentum m and the ε under its
    square root of DC-ASGD-a (``dc-asgd-a``, :mod:`ferret_core.compensation.dc_asgd`); ``dc_bound``: κ of
    its per-element bound |g_out − g| ≤ κ·|g| (ours, not the paper's; ``math.inf``: unbounded).
    """

    lambda0: float = 0.2
    eta_lambda: float = 2e-6
    alpha: float = 0.9
    nu: float = 1e-3
    fisher_lambda: float = 0.2
    gap_eps: float = 1e-12
    dc_lambda0: float = 10.0  # ours, not the paper's 2 (its lr was ~25 × ours): docs/compensation.md §4
    dc_momentum: float = 0.95
    dc_eps: float = 1e-12
    dc_bound: float = 1.0  # ours: |correction| ≤ dc_bound·|g| per element; inf: unbounded, as the paper

    def __post_init__(self) -> None:
        for key in (
            "lambda0", "eta_lambda", "alpha", "nu", "fisher_lambda", "gap_eps", "dc_lambda0", "dc_momentum", "dc_eps"
        ):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ConfigError(f"compensator setting {key} must be a finite number, got {value!r}")
        bound = self.dc_bound
        if isinstance(bound, bool) or not isinstance(bound, (int, float)) or math.isnan(bound) or bound <= 0:
            raise ConfigError(
                f"dc_bound must be a number > 0 (the most DC-ASGD-a's correction may be, per element, as a multiple "
                f"of the gradient's magnitude; inf leaves it unbounded, as the paper), got {bound!r}"
            )
        if self.eta_lambda < 0:
            raise ConfigError(f"eta_lambda must be >= 0 (0 fixes λ = lambda0), got {self.eta_lambda}")
        if not 0 <= self.alpha < 1:
            raise ConfigError(f"alpha is an EMA coefficient and must lie in [0, 1), got {self.alpha}")
        if self.nu < 0:
            raise ConfigError(f"nu is an ℓ2 weight and must be >= 0, got {self.nu}")
        if self.gap_eps <= 0:
            raise ConfigError(f"gap_eps must be > 0 (it keeps Gap-Aware's division finite), got {self.gap_eps}")
        if self.dc_lambda0 < 0:
            raise ConfigError(f"dc_lambda0 must be >= 0 (0 turns DC-ASGD-a's correction off), got {self.dc_lambda0}")
        if not 0 <= self.dc_momentum < 1:
            raise ConfigError(f"dc_momentum is an EMA coefficient and must lie in [0, 1), got {self.dc_momentum}")
        if self.dc_eps <= 0:
            raise ConfigError(f"dc_eps must be > 0 (it keeps DC-ASGD-a's division finite), got {self.dc_eps}")


def relative_change(new: Sequence[Tensor], old: Sequence[Tensor]) -> Tensor:
    """‖new − old‖ / ‖old‖ over the whole stage, as a 0-dim float64 tensor (0 when ``old`` is zero)."""
    if not old:
        return torch.zeros((), dtype=torch.float64)
    diff = list(torch._foreach_sub(list(new), list(old)))
    num = torch.nn.utils.get_total_norm(diff).to(torch.float64)
    den = torch.nn.utils.get_total_norm(list(old)).to(torch.float64)
    return num / den.clamp_min(_TINY)


def _common_device(params: Sequence[Tensor]) -> torch.device:
    devices = {p.device for p in params}
    if len(devices) > 1:
        raise ConfigError(
            f"a stage's parameters must live on one device for its compensator, got {sorted(map(str, devices))}"
        )
    return devices.pop() if devices else torch.device("cpu")


class StageCompensator(ABC):
    """Corrects the stale gradients of one pipeline stage; subclasses name the paper they follow.

    Not thread-safe: the engine serialises ``compensate`` → optimizer step → ``observe_update`` per stage.
    """

    name: ClassVar[str]
    # Whether observe_update needs θ_new − θ_old; callers may skip computing deltas otherwise.
    needs_deltas: ClassVar[bool] = False
    # Whether the deltas it needs are kept in a DeltaRing and nothing else (then :meth:`share_ring` can
    # hand it a ring other processes push to: executor processes)
    keeps_ring: ClassVar[bool] = False
    # Whether what it keeps of the master's updates is a running average of every update in fixed-size
    # state (Gap-Aware's C and its count n): then :meth:`share_average` can hand it storage that other
    # processes fold into (executor processes)
    keeps_average: ClassVar[bool] = False

    def __init__(self, params: Sequence[Tensor], settings: CompensatorSettings) -> None:
        if not isinstance(settings, CompensatorSettings):
            raise ConfigError(f"settings must be a CompensatorSettings, got {type(settings).__name__}")
        self.settings = settings
        self._shapes = tuple(tuple(p.shape) for p in params)
        self._dtypes = tuple(p.dtype for p in params)
        self._device = _common_device(params)
        self._calls = 0
        self._compensated = 0  # calls with τ > 0: the ones relative_correction_mean averages over
        self._truncated = 0
        self._correction_host = 0.0
        self._correction_device: Tensor | None = None  # created on first device-side measurement
        # bumped whenever a state tensor is created or replaced outside observe_update (which the engine
        # follows with a memory re-count anyway): lets the engine's meter cache the state's storages
        self.state_generation = 0

    # ----------------------------------------------------------------------------------- the two calls
    def observe_update(self, delta: Sequence[Tensor]) -> None:
        """Record one update of the master stage: ``delta[i] = θ_new[i] − θ_old[i]``."""
        self._check(delta, "delta")
        if not self._shapes:
            return  # a stage without parameters (e.g. only pooling layers): nothing to track
        with torch.no_grad():
            self._observe(delta)

    def compensate(
        self,
        grads: Sequence[Tensor],
        *,
        staleness: int,
        theta_then: Sequence[Tensor],
        theta_now: Sequence[Tensor],
    ) -> list[Tensor]:
        """Approximate the gradient at ``theta_now`` from ``grads`` computed at ``theta_then``.

        ``staleness`` is τ, the master updates of this stage between the two versions.
        """
        if isinstance(staleness, bool) or not isinstance(staleness, int) or staleness < 0:
            raise ConfigError(f"staleness must be an int >= 0 (v_now − v_read), got {staleness!r}")
        self._check(grads, "grads")
        self._check(theta_then, "theta_then")
        self._check(theta_now, "theta_now")
        self._calls += 1
        if not self._shapes:
            return []
        with torch.no_grad():
            out = self._compensate(list(grads), staleness, theta_then, theta_now)
            if staleness > 0:
                self._compensated += 1
                self._add_correction(self._correction(out, grads, staleness))
        return out

    def follow_staleness(self, limit: int) -> None:
        """Where the compensator keeps deltas for the staleness bound: let that store grow, up to ``limit``
        deltas, to the staleness reached (the wall clock, which does not enforce the schedule's bound).
        A no-op for compensators that keep none."""
        return None

    def share_ring(self, ring: DeltaRing) -> None:
        """Before the first update: walk ``ring``, storage another owner allocated and pushes to (the
        executor processes' shared ring of the stage, :mod:`ferret_core.engine.processes.deltas`), instead
        of a ring of its own. A no-op for compensators that need no deltas; one that needs them but keeps
        them otherwise than in a ring refuses."""
        if self.needs_deltas and not self.keeps_ring:
            raise NotImplementedFeatureError(
                f"compensator {self.name!r} keeps its own record of the master's updates, not a delta ring, so it "
                "cannot walk a shared ring; run it on the thread executors (or use iter-fisher)"
            )

    def share_average(self, average: Sequence[Tensor], count: Tensor) -> None:
        """Before the first update: keep the running average of the master's updates in ``average`` (one
        tensor per parameter, shaped as the stage's) and the updates folded into it in ``count`` (an int64
        tensor of one element), storage another owner allocated (the executor processes' shared average of
        the stage, :mod:`ferret_core.engine.processes.average`), instead of its own. Only compensators that
        keep such an average (``keeps_average``) take one."""
        raise ConfigError(
            f"compensator {self.name!r} keeps no running average of the master's updates, so it cannot share one"
        )

    def tuning_state(self) -> list[Tensor]:
        """What this compensator learns from the gradients it is given, as tensors it updates in place, in
        a fixed order: Iter-Fisher's λ, v_r and v_a, DC-ASGD-a's MeanSquare, and their host-side counts as
        int64 tensors of shape (1,). Empty where it learns nothing from gradients (``none``, ``step-aware``,
        ``fisher``, Gap-Aware, whose C folds the master's updates: :meth:`share_average`) or keeps nothing at
        this stage (never stale). The thread engine keeps one compensator per stage, so every worker's
        gradient updates this state; executor processes keep one per executor and share it per stage through
        :meth:`share_tuning_state` (:mod:`ferret_core.engine.processes.tuning`)."""
        return []

    def share_tuning_state(self, tensors: Sequence[Tensor]) -> None:
        """Before the first call: keep :meth:`tuning_state` in ``tensors`` (shaped and typed as it, in its
        order; storage another owner allocated and other processes update: the stage's shared tuning state
        on executor processes) instead of this compensator's own. Update and read it under one lock (the
        stage's update lock)."""
        mine = [(tuple(t.shape), t.dtype) for t in self.tuning_state()]
        given = [(tuple(t.shape), t.dtype) for t in tensors]
        if not mine:
            raise ConfigError(
                f"compensator {self.name!r} learns nothing from gradients at this stage (or keeps it elsewhere), "
                "so it has no tuning state to share"
            )
        if self._calls:
            raise ConfigError(f"{self.name}: share a tuning state before the first call, this one had {self._calls}")
        if given != mine:
            raise ConfigError(f"{self.name}: a shared tuning state must be shaped and typed as {mine}, got {given}")
        self._adopt_tuning_state(list(tensors))
        self.state_generation += 1

    def fit_ring(self, capacity: int, limit: int) -> None:
        """Before the first update: keep ``capacity`` deltas (the staleness the schedule reaches), growing
        up to ``limit`` (the plan's bound) if a staler gradient comes. A no-op for compensators that keep
        no delta ring."""
        return None

    @property
    def truncated(self) -> int:
        """Calls cut short: the gradient was staler than the deltas kept."""
        return self._truncated

    # ------------------------------------------------------------------------------ subclass hooks
    def _observe(self, delta: Sequence[Tensor]) -> None:
        """Record one master update θ_new − θ_old (only compensators with ``needs_deltas`` use it)."""
        return None

    @abstractmethod
    def _compensate(
        self,
        grads: list[Tensor],
        staleness: int,
        theta_then: Sequence[Tensor],
        theta_now: Sequence[Tensor],
    ) -> list[Tensor]: ...

    def _correction(self, out: Sequence[Tensor], grads: Sequence[Tensor], staleness: int) -> Tensor | float:
        """‖g_τ − g_0‖ / ‖g_0‖ of one compensated call; device-side unless a subclass knows it exactly."""
        if all(o is g for o, g in zip(out, grads, strict=True)):
            return 0.0
        return relative_change(out, grads)

    def _lambda(self) -> float:
        """The current λ, NaN where the compensator has none."""
        return math.nan

    def _adopt_tuning_state(self, tensors: list[Tensor]) -> None:
        """Use ``tensors`` (checked against :meth:`tuning_state`) as this compensator's tuning state; only
        compensators whose :meth:`tuning_state` is not empty are asked to."""
        raise NotImplementedError(f"{self.name} has no tuning state to adopt")

    def _extra_state(self) -> dict[str, Any]:
        return {}

    def _load_extra_state(self, state: Mapping[str, Any]) -> None:
        return None

    def _extra_tensors(self) -> list[Tensor]:
        return []

    # ------------------------------------------------------------------------------- introspection
    def state_tensors(self) -> list[Tensor]:
        """Every tensor this compensator holds (for the engine's independent memory measurement)."""
        tensors = self._extra_tensors()
        if self._correction_device is not None:
            tensors.append(self._correction_device)
        return tensors

    def state_storages(self) -> list[tuple[int, int]]:
        """(data_ptr, nbytes) of the storages of :meth:`state_tensors` (subclasses may cache them)."""
        return [(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()) for t in self.state_tensors()]

    def stats(self) -> dict[str, float]:
        """``lambda``, ``relative_correction_mean`` (over calls with τ > 0), ``calls``, ``compensated``,
        ``truncated``. Reads device-side accumulators, so it synchronises: call it off the hot path."""
        total = self._correction_host
        if self._correction_device is not None:
            total += float(self._correction_device.item())
        return {
            "lambda": self._lambda(),
            "relative_correction_mean": total / self._compensated if self._compensated else 0.0,
            "calls": float(self._calls),
            "compensated": float(self._compensated),
            "truncated": float(self._truncated),
        }

    def state_dict(self) -> dict[str, Any]:
        """A snapshot (tensors are copies; scalars are Python numbers)."""
        total = self._correction_host
        if self._correction_device is not None:
            total += float(self._correction_device.item())
        return {
            "name": self.name,
            "calls": self._calls,
            "compensated": self._compensated,
            "truncated": self._truncated,
            "correction_sum": total,
            **self._extra_state(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a snapshot taken by :meth:`state_dict` of a compensator of the same name and shapes."""
        if state.get("name") != self.name:
            raise ConfigError(
                f"compensator snapshot is for {state.get('name')!r}, this stage runs {self.name!r}; "
                f"build the stage with the snapshot's compensator or drop the snapshot"
            )
        try:
            self._load_extra_state(state)
            self._calls = int(state["calls"])
            self._compensated = int(state["compensated"])
            self._truncated = int(state["truncated"])
            self._correction_host = float(state["correction_sum"])
        except KeyError as err:
            raise ConfigError(f"compensator snapshot for {self.name!r} lacks the key {err}") from None
        self._correction_device = None
        self.state_generation += 1

    # ------------------------------------------------------------------------------------- helpers
    def _add_correction(self, value: Tensor | float) -> None:
        if isinstance(value, float):
            self._correction_host += value
            return
        value = value.to(device=self._device, dtype=torch.float64)
        if self._correction_device is None:
            self._correction_device = value.clone()
            self.state_generation += 1
        else:
            self._correction_device.add_(value)

    def _check(self, tensors: Sequence[Tensor], what: str) -> None:
        shapes = tuple(tuple(t.shape) for t in tensors)
        if shapes != self._shapes:
            raise ConfigError(
                f"{self.name}: {what} must align with the stage's parameters (shapes {list(self._shapes)}), "
                f"got shapes {list(shapes)}"
            )
