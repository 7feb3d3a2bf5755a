"""A trampoline that makes a child process die with its parent, even when the parent is SIGKILLed.

    python -I -S deathsig.py PARENT_PID [SIGNAL] -- PROGRAM ARG...

On Linux it asks the kernel for ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` (or SIGNAL, a name such as ``TERM``:
the supervisor's trainer drains and snapshots on SIGTERM) and then ``exec``s PROGRAM, which
keeps the setting (it survives ``execve`` except for set-user-ID programs), so the static Tansu and Valkey
binaries and the ``ferret run`` / ``ferret produce`` children need no cooperation. Setting it in the
child before ``exec`` is the robust order: ``subprocess.Popen(preexec_fn=...)`` could do the same, but
``preexec_fn`` is unsafe once the parent runs threads (grpc, torch), and a pipe the child watches for EOF
needs a watcher in every child. If the parent died before ``prctl`` took effect, no signal would ever
come: the trampoline checks ``getppid()`` against PARENT_PID after setting it and exits (status 1) when
the parent is gone.

Caveat from prctl(2): the signal is sent when the *thread* that forked the child exits, so spawn from a
thread that lives as long as the child (the services spawn from the main thread). Elsewhere than Linux
the trampoline only ``exec``s (no such kernel feature; the finalizers of ``ChildProcess`` still stop
children on a normal exit).

Run as a script with ``-I -S`` (standard library only, no site-packages) so it starts in ~20 ms; it
imports nothing from Ferret.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1
EXIT_PARENT_GONE = 1
EXIT_USAGE = 2
EXIT_EXEC_FAILED = 127


def die_with_parent(signum: int = signal.SIGKILL) -> bool:
    """Ask Linux to send ``signum`` to this process when its parent thread exits; False where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl(PR_SET_PDEATHSIG) failed: {os.strerror(errno)}")
    return True


def main(argv: list[str]) -> int:
    named = len(argv) >= 5 and argv[3] == "--" and hasattr(signal, f"SIG{argv[2]}")
    if not (named or (len(argv) >= 4 and argv[2] == "--")) or not argv[1].isdigit():
        print("usage: deathsig.py PARENT_PID [SIGNAL] -- PROGRAM [ARG...]", file=sys.stderr)
        return EXIT_USAGE
    parent = int(argv[1])
    signum = getattr(signal, f"SIG{argv[2]}") if named else signal.SIGKILL
    program = argv[4:] if named else argv[3:]
    if die_with_parent(signum) and os.getppid() != parent:
        return EXIT_PARENT_GONE  # the parent died before the request took effect: nothing would signal us
    try:
        os.execvp(program[0], program)
    except OSError as exc:
        print(f"deathsig: cannot run {program[0]!r}: {exc}", file=sys.stderr)
        return EXIT_EXEC_FAILED
    return EXIT_EXEC_FAILED  # not reached: execvp replaces the process


if __name__ == "__main__":
    sys.exit(main(sys.argv))
