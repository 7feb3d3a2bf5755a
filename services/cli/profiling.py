"""Profiling a model from the CLI, one way for every command: ``ferret profile``, ``ferret plan --model``
and ``ferret simulate`` without ``--profile`` all time the units through :func:`profile_now`.

It pins torch's CPU threads (default :data:`THREADS`, one, as the trainer runs them: DESIGN §5) for the
profiling and turns denormals off, then calls the core's profiler with the same warm-up, repeats and
clock defaults as ``ferret profile``. With one thread the ``auto`` clock is the thread's CPU time, which
other processes on a shared machine cannot inflate. Before this helper, ``ferret plan --model`` profiled
with torch's default threads (2 here) on the wall clock: MNISTNet's t^d came out 44–48 ms against
0.53 ms from ``ferret profile``, and the printed plan (2 × 4) was not the trainer's (1 × 1).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch

from ferret_core.errors import ConfigError
from ferret_core.planning import profiler
from ferret_core.profile import ModelProfile
from ferret_core.zoo import ZooModel

THREADS = 1
WARMUP = 3
REPEATS = 10
CLOCK = "auto"


def profile_now(
    model: ZooModel,
    *,
    device: str = "cpu",
    dtype: str = "float32",
    threads: int = THREADS,
    warmup: int = WARMUP,
    repeats: int = REPEATS,
    batch_size: int = 1,
    batch_sizes: Sequence[int] = (),
    clock: str = CLOCK,
    progress: profiler.ProgressCallback | None = None,
) -> ModelProfile:
    """``model``'s profile, timed on ``threads`` torch CPU threads (restored afterwards) with denormals
    flushed (left on: the commands that profile then plan or train as the trainer does); the other
    arguments are :func:`ferret_core.planning.profiler.profile_model`'s. The profile's ``meta`` records
    the threads and the clock used."""
    with pinned_threads(threads):
        torch.set_flush_denormal(True)  # denormals slowed MNISTNet 3 ms → 28 ms per step (DESIGN §5)
        return profiler.profile_model(
            model,
            device=device,
            dtype=dtype,
            warmup=warmup,
            repeats=repeats,
            batch_size=batch_size,
            batch_sizes=batch_sizes,
            clock=clock,
            progress=progress,
        )


@contextmanager
def pinned_threads(threads: int) -> Iterator[None]:
    """Run the block on ``threads`` torch intra-op threads, then put the previous count back."""
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ConfigError(f"threads must be an integer >= 1, got {threads!r}")
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)
