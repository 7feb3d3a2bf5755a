"""Entry point of the ``ferret`` command.

Each command lives in its own module with ``register(subparsers)``; the module's handler returns the
process exit status. Exit statuses (DESIGN §4): 0 success, 2 usage error, 3 infeasible budget,
1 any other failure with a one-line reason.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from ferret_core.errors import FerretError, InfeasibleBudgetError

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INFEASIBLE = 3

# Modules that provide a ``register(subparsers)`` function, in the order --help lists them.
COMMAND_MODULES: tuple[str, ...] = (
    "services.cli.plan_cmd",
    "services.cli.profile_cmd",
    "services.cli.produce_cmd",
    "services.cli.run_cmd",
    "services.cli.control_cmd",
    "services.cli.simulate_cmd",
    "services.cli.demo_cmd",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ferret",
        description="Ferret: online continual learning on a stream under a memory budget.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args))
    except InfeasibleBudgetError as exc:
        print(f"ferret: infeasible budget: {exc}", file=sys.stderr)
        return EXIT_INFEASIBLE
    except FerretError as exc:
        print(f"ferret: error: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        print("ferret: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
