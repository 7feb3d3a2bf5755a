"""``ferret demo``'s signals: SIGINT (Ctrl-C) and SIGTERM interrupt the run whatever disposition the demo
inherited, and the previous handlers come back afterwards (docs/reliability.md, "Ctrl-C ignored").

A process started with SIGINT ignored (``cmd &`` in a script, ``nohup``, a CI runner) keeps it ignored
across ``exec``, and Python then installs no KeyboardInterrupt handler: before ``interrupt_on_signals``
set SIGINT itself, such a demo ignored Ctrl-C and streamed on (3 of 3 full-suite runs)."""

from __future__ import annotations

import io
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType

import pytest

from ferret_core.plan import Plan
from services.cli.demo_cmd import interrupt_on_signals
from services.control.client import ControlClient
from services.control.deadline import CallDeadline
from services.control.server import create_server
from services.control.trainer_port import AppliedPlan
from services.demo.options import DemoOptions
from services.demo.orchestrator import DemoRun
from services.demo.record import PlanView

from .control_fakes import PLANNER, FakeTrainer

_Handler = Callable[[int, FrameType | None], object] | int | signal.Handlers | None


def _on_main_thread() -> None:
    assert threading.current_thread() is threading.main_thread(), "signal handlers are set on the main thread"


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize(
    "inherited",
    [signal.SIG_IGN, signal.default_int_handler],
    ids=["inherited-ignored", "python-default"],
)
def test_sigint_and_sigterm_interrupt_the_demo_whatever_it_inherited(signum: int, inherited: _Handler) -> None:
    _on_main_thread()
    outer = signal.signal(signum, inherited)
    try:
        with pytest.raises(KeyboardInterrupt), interrupt_on_signals():
            signal.raise_signal(signum)  # the Python handler runs before the next line
            pytest.fail(f"signal {signum} did not interrupt the demo (it was {inherited!r} before)")
        assert signal.getsignal(signum) is inherited  # put back on the way out
    finally:
        signal.signal(signum, outer)


class _BlockingTrainer(FakeTrainer):
    """Holds every ``apply_plan`` (the trainer's side of SetMemoryBudget) until ``release`` is set."""

    def __init__(self) -> None:
        super().__init__(PLANNER.plan(None))
        self.entered = threading.Event()
        self.release = threading.Event()

    def apply_plan(self, plan: Plan, version: int, deadline: CallDeadline | None = None) -> AppliedPlan:
        self.entered.set()
        self.release.wait()
        return super().apply_plan(plan, version, deadline)


class _RunningChild:
    """What ``DemoRun._follow`` reads of a child process that keeps running."""

    running = True
    returncode = None

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path


def test_ctrl_c_while_the_budget_change_is_in_flight_does_not_wait_for_the_call(tmp_path: Path) -> None:
    """SIGINT while SetMemoryBudget is in flight (60 s deadline) interrupts the demo's loop, and closing the
    channel cancels the call instead of waiting for it: the stop does not depend on the trainer answering."""
    _on_main_thread()
    trainer = _BlockingTrainer()
    server = create_server(PLANNER, trainer, max_watchers=1, unary_workers=4).start()
    watchdog = threading.Timer(30.0, trainer.release.set)  # a stop that waited for the call ends only here
    options = DemoOptions(
        dataset="digits", model="mlp", out_dir=tmp_path, topic_prefix="demo-x", items=100, tick_s=0.02
    )
    run = DemoRun(options, view_stream=io.StringIO())
    child = _RunningChild(tmp_path / "child.log")

    def interrupt_once_in_flight() -> None:
        if trainer.entered.wait(30.0):
            signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)

    try:
        client = ControlClient(server.target, timeout_s=60.0)
        run.record.plan_before = PlanView.from_reply(client.get_plan())
        budget = run._budget_step(run.record.plan_before)  # a cut: this planner has smaller plans
        threading.Thread(target=interrupt_once_in_flight, daemon=True).start()
        watchdog.start()
        with pytest.raises(KeyboardInterrupt), interrupt_on_signals(), client:
            run._follow(client, child, child, budget)  # type: ignore[arg-type]
        released_before_stopped = trainer.release.is_set()
        assert trainer.entered.is_set(), "the budget change never reached the trainer"
        assert not released_before_stopped, "the stop waited for the in-flight SetMemoryBudget call to end"
        assert not run.record.budget_changes  # the interrupted change is not reported as applied
    finally:
        watchdog.cancel()
        trainer.release.set()
        server.stop(grace_s=1.0)
