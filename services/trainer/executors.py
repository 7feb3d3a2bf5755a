"""Which executors the trainer trains on (``trainer.executors``), the planner's caps that follow from
them, and the learner that drives them.

* ``processes``: :class:`~services.trainer.process_learner.ProcessLearner`, each live (worker, stage)
  executor an OS process over a master in shared memory; the record path keeps this process.
* ``threads``: :class:`~services.trainer.engine_learner.EngineLearner`, the wall clock's executor threads
  (or, one executor on CPU, the record path's own thread between batches).
* ``auto`` (the default): **processes where more than one executor pays**, measured on this 2-core
  machine (``benchmarks/distributed/results/throughput.md``, trained items/s at 2× the plain loop's
  capacity, ÷ the plain loop on the same stream): worker processes trained 1.11–1.41× (MNISTNet),
  1.30–1.41× (ConvNet) and 1.67× (ResNet-18) where the thread engine's inline 1 × 1 trained 0.70–0.87×;
  for the digits MLP (0.42 ms per item by the profile) each item's messages cost more than its training
  (0.77× against the inline engine's 0.50× and, with the caps of threads, the loop-thread 1 × 1 the
  trainer runs). So ``auto`` picks processes when the device is the CPU, the machine has ≥ 2 cores, the
  profile's one-item time Σ(t^f + t^b) is at least :data:`PROCESS_MIN_ITEM_S`, and the method and
  compensator run on process executors; otherwise threads, with the reason logged.

**Caps.** On processes the planner may use one worker per core *beside the record path's*, N ≤ cores − 1
(at least 1; ``trainer.max_workers`` overrides), and one stage (``trainer.max_stages`` overrides). The
record path (consume, decode, predict every item, publish) keeps a core busy at saturation, and an
executor that shares a core with it or with another executor is preempted while it holds its stage's
slot lock: on this 2-core machine, MNISTNet at 520 items/s without Kafka (``ProcessLearner`` alone), one
worker trained 34.7 % of the items and two 12.3 % (Iter-Fisher-lean, whose correction at staleness ≥ 1
costs 7.5 ms per item on MNISTNet's 1.2 M weights, twice its training step) or 37.3 % (no compensator);
with the broker beside them, the demo's two workers trained 1,456 of 6,000 items where one trained 3,084.
Stages as processes exchange each item's activation and gradient through gloo, and on 2 cores they
trained less than worker processes on every model measured (MNISTNet 0.64×, ConvNet 0.67×, ResNet-18
1.51× against 1.67× for two workers). On threads the caps are as before (:func:`thread_caps`).

**Several hosts** (``trainer.hosts: torchrun``, docs/service.md "Several hosts"): always processes; the
stages live on the other hosts (:mod:`ferret_core.planning.placement`), which run no record path, so the caps
are N ≤ cores and P ≤ the serving hosts (one stage per host; ``trainer.max_workers`` / ``max_stages``
override). The other hosts' cores are taken to be this host's (the job's hosts are alike, as a
Deployment's pods are); set ``trainer.max_workers`` where they are not.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Literal

from ferret_core.engine.processes.hosts import Hosts
from ferret_core.engine.processes.settings import ProcessSettings, check_supported
from ferret_core.errors import ConfigError, NotImplementedFeatureError
from ferret_core.plan import Plan
from ferret_core.planning.placement import serving_hosts
from ferret_core.planning.profiler import resolve_device
from ferret_core.profile import ModelProfile
from ferret_core.zoo import ZooModel
from services.config import Settings
from services.trainer.engine_learner import EngineLearner
from services.trainer.guard.learner import GuardedLearner
from services.trainer.learner import Learner
from services.trainer.live_methods import live_setup
from services.trainer.process_learner import ProcessLearner

log = logging.getLogger("ferret.trainer")

PROCESS_MIN_ITEM_S = 1e-3  # below this one-item time (t^f + t^b), an item's messages cost more than its training

ExecutorKind = Literal["threads", "processes"]


@dataclass(frozen=True)
class ExecutorChoice:
    """The executors the trainer runs on and why (logged at start-up, shown in docs/service.md)."""

    kind: ExecutorKind
    reason: str
    configured: bool = False  # ``trainer.executors`` named it (a refusal is then an error, not a fallback)
    hosts: int = 1  # the job's hosts (``trainer.hosts: torchrun``): the trainer's and those serving its stages


def choose_executors(settings: Settings, profile: ModelProfile, *, hosts: int = 1) -> ExecutorChoice:
    """``trainer.executors`` resolved by the rule of the module docstring (the method's support is checked
    on the plan: :func:`process_refusal`); ``hosts``: the job's size under ``trainer.hosts: torchrun``."""
    t = settings.trainer
    if t.hosts != "off":
        return ExecutorChoice("processes", f"trainer.hosts: {t.hosts}, {hosts} host(s)", configured=True, hosts=hosts)
    if t.executors != "auto":
        return ExecutorChoice(t.executors, f"trainer.executors: {t.executors}", configured=True)
    device = resolve_device(t.device)
    cores = os.cpu_count() or 1
    if device.type != "cpu":
        return ExecutorChoice("threads", f"device {device} (process executors run CPU stages only)")
    if cores < 2:
        return ExecutorChoice("threads", "one CPU core: no core for an executor process beside the record path")
    item_s = profile.sequential_time
    if item_s < PROCESS_MIN_ITEM_S:
        return ExecutorChoice(
            "threads",
            f"one item trains in {item_s * 1e3:.2f} ms by the profile, under {PROCESS_MIN_ITEM_S * 1e3:g} ms: "
            "its messages to an executor process would cost more than its training",
        )
    floor = f"{PROCESS_MIN_ITEM_S * 1e3:g} ms"
    reason = f"{cores} CPU cores and {item_s * 1e3:.2f} ms per item by the profile (≥ {floor})"
    return ExecutorChoice("processes", reason)


def executor_caps(settings: Settings, choice: ExecutorChoice) -> tuple[int, int | None]:
    """(max workers N, max stages P) of the live planner for ``choice`` (module docstring)."""
    t = settings.trainer
    cpus = max(1, os.cpu_count() or 1)
    if choice.kind == "processes" and choice.hosts > 1:  # the stages on the other hosts: no record path there
        workers = t.max_workers if t.max_workers is not None else cpus
        return workers, (t.max_stages if t.max_stages is not None else serving_hosts(choice.hosts))
    if choice.kind == "processes":
        workers = t.max_workers if t.max_workers is not None else max(1, cpus - 1)
        return workers, (t.max_stages if t.max_stages is not None else 1)
    return thread_caps(settings)


def thread_caps(settings: Settings) -> tuple[int, int | None]:
    """(max workers N, max stages P) on executor threads. ``trainer.max_workers``/``max_stages`` when either
    is set (N defaults to the CPU count, P to no cap); with neither, planning for the stream's own rate
    (``arrival_interval: measured``, the default) on CPU, one worker and one stage: the executors are
    threads of this process sharing the cores and the GIL with the record path, and more of them trained
    fewer items per second (MNISTNet: 1 × 2 0.31×, 2 × 1 0.80×, 2 × 2 0.33× of 1 × 1 at 294/s;
    ``benchmarks/engine/results/plan_throughput.md``, docs/planner.md reading 11). A configured interval
    (``auto``, the paper's rate, ``Kx``, seconds) plans as the paper does: N up to the CPU count, any P; so
    does a GPU device."""
    t = settings.trainer
    cpus = max(1, os.cpu_count() or 1)
    live = t.arrival_interval == "measured"
    if t.max_workers is None and t.max_stages is None and live and resolve_device(t.device).type == "cpu":
        return 1, 1
    return (t.max_workers if t.max_workers is not None else cpus), t.max_stages


def process_refusal(settings: Settings, model: ZooModel, profile: ModelProfile | None, plan: Plan) -> str | None:
    """Why the trainer's method and compensator cannot run ``plan`` on executor processes (None: they can)."""
    t = settings.trainer
    setup, _ = live_setup(t.method, plan, model.name, model.num_units, profile=profile, compensator=t.compensator)
    try:
        check_supported(setup, ProcessSettings(lr=t.lr, compensator=t.compensator))
    except NotImplementedFeatureError as exc:
        return str(exc)
    return None


def refused(choice: ExecutorChoice, refusal: str) -> ExecutorChoice:
    """The choice after a refusal: an error where ``trainer.executors: processes`` was configured, else
    threads with the reason."""
    if choice.configured:
        raise ConfigError(
            f"trainer.executors is 'processes' but {refusal}; set trainer.executors: threads (or auto), or "
            "choose a method and compensator that run on process executors"
        )
    return ExecutorChoice("threads", refusal)


def make_learner(
    choice: ExecutorChoice,
    model: ZooModel,
    plan: Plan,
    settings: Settings,
    profile: ModelProfile | None,
    hosts: Hosts | None = None,
) -> Learner:
    """The learner for ``choice``, guarded (:mod:`services.trainer.guard`) unless ``guard.enabled`` is off;
    ``hosts``: the job's other hosts, which own the stages (``trainer.hosts: torchrun``)."""
    log.info("training on executor %s: %s", choice.kind, choice.reason)
    inner: Learner
    if hosts is not None and choice.kind != "processes":
        raise ConfigError(f"several hosts train on executor processes only, got executors {choice.kind!r}")
    if choice.kind == "processes":
        inner = ProcessLearner(model, plan, settings, profile, hosts=hosts)
    else:
        inner = EngineLearner(model, plan, settings, profile)
    return GuardedLearner(inner, model, settings.guard) if settings.guard.enabled else inner
