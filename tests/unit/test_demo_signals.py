"""``ferret demo``'s signals: SIGINT (Ctrl-C) and SIGTERM interrupt the run whatever disposition the demo
inherited, and the previous handlers come back afterwards (docs/reliability.md, "Ctrl-C ignored").

A process started with SIGINT ignored (``cmd &`` in a script, ``nohup``, a CI runner) keeps it ignored
across ``exec``, and Python then installs no KeyboardInterrupt handler: before ``interrupt_on_signals``
set SIGINT itself, such a demo ignored Ctrl-C and streamed on (3 of 3 full-suite runs)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType

import pytest

from services.cli.demo_cmd import interrupt_on_signals

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
