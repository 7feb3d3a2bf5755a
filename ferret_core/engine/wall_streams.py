"""The wall clock's CUDA streams (DESIGN §2, "Devices").

On CPU the threads share the cores (one torch thread each; the GIL serialises the Python parts, kernels
release it). On CUDA each executor thread issues its work on a CUDA stream of its own and, before
publishing an action's results, records an event on that stream and waits for it
(:func:`cuda_action_barrier`, the pipeline's ``end_of_action``), so a tensor handed to another stream or
thread is complete and its memory is not reused while a kernel reads it (tests marked ``gpu``).
"""

from __future__ import annotations

import torch


class _NoStream:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def stream_for(device: torch.device) -> torch.cuda.StreamContext | _NoStream:
    """A new CUDA stream on ``device`` for the calling thread's work, entered by ``with``; on the CPU,
    nothing."""
    if device.type == "cuda":
        return torch.cuda.stream(torch.cuda.Stream(device))  # type: ignore[no-untyped-call]
    return _NoStream()


def cuda_action_barrier() -> None:
    """Make an action's work on the current CUDA stream complete before its results are published."""
    event = torch.cuda.Event()  # type: ignore[no-untyped-call]
    event.record()
    event.synchronize()
