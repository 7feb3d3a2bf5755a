"""``ferret simulate`` with compensator settings other than the defaults, for this benchmark's sweeps only.

The CLI builds ``CompensatorSettings()`` (the defaults; no config key exposes them). This wrapper replaces
that constructor in the simulate command's namespace with one whose given fields are fixed, then runs
the CLI with the remaining arguments, e.g.

    python -m benchmarks.compensation.simulate_with --set dc_lambda0=20 -- simulate --dataset mnist ...
"""

from __future__ import annotations

import argparse
import functools
import sys

from ferret_core.compensation import CompensatorSettings
from services.cli import simulate_cmd
from services.cli.main import main as cli_main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="a CompensatorSettings field")
    parser.add_argument("argv", nargs=argparse.REMAINDER, help="-- then the ferret command line")
    args = parser.parse_args()
    fields = {}
    for item in args.set:
        key, _, value = item.partition("=")
        fields[key] = float(value)
    CompensatorSettings(**fields)  # fail early on a bad field or value
    simulate_cmd.CompensatorSettings = functools.partial(CompensatorSettings, **fields)  # type: ignore[misc]
    rest = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    return cli_main(rest)


if __name__ == "__main__":
    sys.exit(main())
