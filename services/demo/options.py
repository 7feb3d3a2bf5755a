"""What one ``ferret demo`` run does, and how its defaults are chosen (pure: no processes, no network).

Defaults (DESIGN §6: no flags and no network needed):

- dataset: ``mnist`` when ``<data root>/MNIST/raw`` exists, else ``digits`` (bundled with scikit-learn);
- model: ``mnistnet`` for 28×28 single-channel datasets, ``mlp`` otherwise;
- profile: the committed ``benchmarks/profiles/<model>.json`` when it fits the dataset's input
  (same number of input elements and classes), else none (the trainer profiles at start-up);
- 6000 items at :data:`RATE_OVER_PLAIN` (1.5) × the rate a plain loop predicts and trains on this machine
  (measured before the stack starts, :func:`services.demo.baseline.plain_loop_rate`): a stream one
  sequential loop cannot keep up with, which is where Ferret's workers pay — where the trainer trains on
  executor processes (docs/service.md "Executors"); for a model it trains on threads (the digits MLP),
  :data:`DEFAULT_RATE` (``services.cli.demo_cmd.default_rate``);
- the budget starts unconstrained and changes once, after 40 % of the items were predicted, to halfway
  between the plan's minimum feasible bytes and its predicted bytes (read from GetPlan), which re-plans
  the running pipeline to a smaller plan (fewer workers, T1–T3) — when a smaller plan exists. Where none
  does, the demo says so in its log and report and asks for half the minimum instead, to show the control
  plane's answer to an infeasible budget (FAILED_PRECONDITION with the minimum; the plan in force
  unchanged) — :func:`budget_step`. On a 2-core machine that is the case: the plan is one executor
  process beside the record path (docs/service.md "Executors"), already the smallest feasible one; with
  more cores the plan has more workers and the budget step removes some.
"""

from __future__ import annotations

import json
import math
import secrets
import sys
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from ferret_core.data import dataset_spec
from ferret_core.errors import ConfigError, InfeasibleBudgetError

DEFAULT_ITEMS = 6000
DEFAULT_RATE = 50.0  # items/s where the trainer trains on threads (a tiny model, one core): one worker keeps up
RATE_OVER_PLAIN = 1.5  # the default stream: this many times the rate a plain loop trains every item
DEFAULT_CHANGE_AT = 0.4
DEFAULT_PARTITIONS = 2
DEFAULT_SNAPSHOT_INTERVAL_S = 5.0
REPO_ROOT = Path(__file__).resolve().parents[2]
PROFILES_DIR = REPO_ROOT / "benchmarks" / "profiles"


@dataclass(frozen=True)
class DemoOptions:
    """Everything a run needs, resolved (see :func:`resolve_dataset` and friends for the defaults)."""

    dataset: str
    model: str
    out_dir: Path
    topic_prefix: str
    data_root: Path | None = None
    profile: Path | None = None
    items: int = DEFAULT_ITEMS
    rate: float = DEFAULT_RATE
    budget: int | None = None  # None: unconstrained (the paper's M+)
    new_budget: int | None = None  # None: halfway between min feasible and the plan's predicted bytes
    change_at: float = DEFAULT_CHANGE_AT
    bootstrap_servers: str | None = None  # None: start the embedded broker
    redis_url: str | None = None  # None: start the embedded Valkey
    live: bool = True
    plain_consumer: bool = True  # after Ferret's run, the live plain consumer on the same items and rate
    partitions: int = DEFAULT_PARTITIONS
    snapshot_interval_s: float = DEFAULT_SNAPSHOT_INTERVAL_S
    keep_stack: bool = False  # leave the broker, Redis and the trainer running at the end (not on Ctrl-C)
    log_format: str = "text"  # the demo's progress and its children's logs: text or json
    # How the children are started: the ``ferret`` entry point of this interpreter (tests may swap it).
    ferret_command: tuple[str, ...] = field(default_factory=lambda: ferret_command())
    startup_timeout_s: float = 180.0
    stall_timeout_s: float = 60.0  # give up when no prediction arrived for this long while items remain
    stop_timeout_s: float = 60.0  # SIGTERM → drain, snapshot, commit; SIGKILL after this
    tick_s: float = 0.5  # status refresh interval

    def __post_init__(self) -> None:
        if self.items < 1:
            raise ConfigError(f"--items must be >= 1, got {self.items}")
        if not (math.isfinite(self.rate) and self.rate > 0):
            raise ConfigError(f"--rate must be a positive number of items per second, got {self.rate}")
        if not 0.0 <= self.change_at <= 1.0:
            raise ConfigError(f"--change-at must be a fraction in [0, 1], got {self.change_at}")
        if self.new_budget is not None and self.new_budget <= 0:
            raise ConfigError(f"--new-budget must be > 0 bytes, got {self.new_budget}")

    @property
    def change_after_predictions(self) -> int:
        """Predictions the trainer must have published before the budget changes."""
        return math.ceil(self.change_at * self.items)


def ferret_command() -> tuple[str, ...]:
    """The ``ferret`` console script next to this interpreter, else ``python -m services.cli.main``."""
    script = Path(sys.executable).parent / "ferret"
    if script.is_file():
        return (str(script),)
    return (sys.executable, "-m", "services.cli.main")


def resolve_dataset(dataset: str | None, data_root: Path | None) -> str:
    """``dataset`` when given, else ``mnist`` when ``data_root/MNIST/raw`` exists, else ``digits``."""
    if dataset is not None:
        return dataset
    if data_root is not None and (data_root / "MNIST" / "raw").is_dir():
        return "mnist"
    return "digits"


def resolve_model(model: str | None, dataset: str) -> str:
    """``model`` when given, else ``mnistnet`` for 1×28×28 inputs and ``mlp`` for anything else."""
    if model is not None:
        return model
    shape, _ = dataset_spec(dataset)
    return "mnistnet" if tuple(shape) == (1, 28, 28) else "mlp"


def committed_profile(model: str, dataset: str, profiles_dir: Path = PROFILES_DIR) -> Path | None:
    """The committed profile of ``model`` when it was taken for this dataset's input and classes.

    A profile's sizes (parameters, activations) depend on the input and the number of classes, so e.g.
    ``mlp.json`` (784 inputs) is not used for ``digits`` (64 inputs): the trainer profiles instead.
    """
    path = profiles_dir / f"{model}.json"
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        profile_inputs = math.prod(int(n) for n in data["input_shape"])
        profile_classes = int(data.get("meta", {}).get("num_classes", 10))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    shape, classes = dataset_spec(dataset)
    if data.get("model") != model or profile_inputs != math.prod(shape) or profile_classes != classes:
        return None
    return path


def run_stamp(now: datetime | None = None) -> str:
    """``YYYYmmdd-HHMMSS`` of ``now`` (local time): names the run's out dir and topic prefix."""
    return (now or datetime.now()).strftime("%Y%m%d-%H%M%S")


def default_out_dir(stamp: str, base: Path | None = None) -> Path:
    return (base or Path("out")) / f"demo-{stamp}"


def fresh_topic_prefix(stamp: str) -> str:
    """``demo-<stamp>-<4 hex>``: fresh per run, also on a shared external broker."""
    return f"demo-{stamp}-{secrets.token_hex(2)}"


def default_new_budget(min_feasible_bytes: int, planned_bytes: int) -> int:
    """Halfway between the minimum feasible bytes and the current plan's predicted bytes."""
    return (int(min_feasible_bytes) + int(planned_bytes)) // 2


@dataclass(frozen=True)
class BudgetStep:
    """The demo's one SetMemoryBudget call: ``budget`` bytes, and whether the trainer is expected to refuse
    it (``refusal``: no plan smaller than the one in force exists, so the demo shows the refusal instead of
    a cut that would change nothing). ``why``: one line for the log and the report."""

    budget: int
    refusal: bool
    why: str


def budget_step(min_feasible_bytes: int, planned_bytes: int, new_budget: int | None = None) -> BudgetStep:
    """What the demo's budget step asks for, given the start-up plan (GetPlan):

    - ``new_budget`` (``--new-budget``) when given; below the minimum feasible bytes it is refused here,
      before streaming (:class:`InfeasibleBudgetError`);
    - else, when a smaller plan exists (minimum < predicted), a cut halfway between the two
      (:func:`default_new_budget`): the planner must give up R_F (T1–T4, fewer workers) to fit it;
    - else (the plan in force is the smallest feasible one) half the minimum feasible bytes, which the
      trainer must refuse (FAILED_PRECONDITION, the minimum in the reply, the plan unchanged).
    """
    minimum, predicted = int(min_feasible_bytes), int(planned_bytes)
    if new_budget is not None:
        if new_budget < minimum:
            raise InfeasibleBudgetError(new_budget, minimum)
        return BudgetStep(new_budget, False, f"--new-budget {new_budget} bytes")
    if minimum < predicted:
        budget = default_new_budget(minimum, predicted)
        why = f"halfway between the minimum feasible {minimum} and the planned {predicted} bytes"
        return BudgetStep(budget, False, why)
    return BudgetStep(
        max(1, minimum // 2),
        True,
        f"no budget changes the plan: the plan in force ({predicted} bytes) is already the smallest feasible one "
        f"for this model, stream rate and machine (one unsplit worker: it keeps up, docs/planner.md reading 10, "
        f'or the machine has no core for a second, docs/service.md "Executors"); asking for '
        f"half the minimum, {max(1, minimum // 2)} bytes, to show the control plane's refusal",
    )
