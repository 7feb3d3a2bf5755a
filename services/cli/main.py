"""Entry point of the ``ferret`` command.

Each command lives in its own module with ``register(subparsers)``; the module's handler returns the
process exit status. Exit statuses (DESIGN §4): 0 success, 2 usage error, 3 infeasible budget,
1 any other failure with a one-line reason (a JSON log line under ``--log-format json``), 130 on Ctrl-C,
141 (128 + SIGPIPE, as coreutils) when the reader of stdout went away (``ferret control watch | head``),
without a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence
from importlib import metadata

from ferret_core.errors import FerretError, InfeasibleBudgetError, InfeasibleHostBudgetError

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INFEASIBLE = 3
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141
DISTRIBUTION = "ferret-ocl"  # the name on the package index; the command is `ferret`

# Modules that provide a ``register(subparsers)`` function, in the order --help lists them.
COMMAND_MODULES: tuple[str, ...] = (
    "services.cli.plan_cmd",
    "services.cli.profile_cmd",
    "services.cli.produce_cmd",
    "services.cli.run_cmd",
    "services.cli.control_cmd",
    "services.cli.predictions_cmd",
    "services.cli.export_cmd",
    "services.cli.serve_cmd",
    "services.cli.simulate_cmd",
    "services.cli.demo_cmd",
    "services.cli.bench_cmd",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ferret",
        description="Ferret: online continual learning on a stream under a memory budget.",
    )
    parser.add_argument("--version", action="version", version=version_text(), help="print the version and exit")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def version_text() -> str:
    """``ferret X.Y.Z (ferret-ocl, Python A.B.C)``: the installed distribution's version."""
    try:
        version = metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        version = "(not installed: run `pip install -e .` or bash scripts/setup.sh)"
    python = ".".join(map(str, sys.version_info[:3]))
    return f"ferret {version} ({DISTRIBUTION}, Python {python})"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # as given: what `run --supervise` re-runs
    try:
        return int(args.handler(args))
    except (InfeasibleBudgetError, InfeasibleHostBudgetError) as exc:
        _fail(args, f"infeasible budget: {exc}")
        return EXIT_INFEASIBLE
    except FerretError as exc:
        _fail(args, f"error: {exc}")
        return EXIT_FAILURE
    except KeyboardInterrupt:
        _fail(args, "interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_BROKEN_PIPE


def _fail(args: argparse.Namespace, reason: str) -> None:
    """The one-line reason on stderr; a JSON log line when the command logs JSON."""
    if getattr(args, "log_format", "text") == "json":
        logging.getLogger("ferret").error(reason)
    else:
        print(f"ferret: {reason}", file=sys.stderr)


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush cannot raise BrokenPipeError again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout already closed or not a real file
        pass


if __name__ == "__main__":
    sys.exit(main())
