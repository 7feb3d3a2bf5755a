"""What this checkout's ``ferret simulate`` offers, read from its own argument parser (the registries'
names are its choices), and the clear error for a name it does not offer.

The bench addresses methods, OCL algorithms and compensators by their registry names and runs them
through ``ferret simulate``; a name this checkout does not register (an older or trimmed-down checkout)
stops the bench before any run, naming the name, what this checkout offers instead, and the part of
Ferret that registers it.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

from ferret_core.errors import FerretError
from services.bench.specs import ExperimentSpec

# What registers a name a checkout may lack.
PROVIDERS: dict[str, str] = {
    "random-n": "the buffering baselines (Random-N, Last-N, Camel: ferret_core/engine/buffering.py)",
    "last-n": "the buffering baselines (Random-N, Last-N, Camel: ferret_core/engine/buffering.py)",
    "camel": "the buffering baselines (Random-N, Last-N, Camel: ferret_core/engine/buffering.py)",
    "er": "the OCL algorithms (ER, MIR, LwF, MAS: ferret_core/ocl, ferret simulate --algorithm)",
    "mir": "the OCL algorithms (ER, MIR, LwF, MAS: ferret_core/ocl, ferret simulate --algorithm)",
    "lwf": "the OCL algorithms (ER, MIR, LwF, MAS: ferret_core/ocl, ferret simulate --algorithm)",
    "mas": "the OCL algorithms (ER, MIR, LwF, MAS: ferret_core/ocl, ferret simulate --algorithm)",
    "dapple": "the pipeline schedules (ferret_core/engine/schedules, ferret_core/engine/method_registry.py)",
    "zb": "the pipeline schedules (ferret_core/engine/schedules, ferret_core/engine/method_registry.py)",
    "hanayo-1w": "the pipeline schedules (ferret_core/engine/schedules, ferret_core/engine/method_registry.py)",
    "hanayo-2w": "the pipeline schedules (ferret_core/engine/schedules, ferret_core/engine/method_registry.py)",
    "hanayo-3w": "the pipeline schedules (ferret_core/engine/schedules, ferret_core/engine/method_registry.py)",
    "pipedream": "the pipeline schedules (ferret_core/engine/schedules, ferret_core/engine/method_registry.py)",
    "pipedream-2bw": "the pipeline schedules (ferret_core/engine/schedules, ferret_core/engine/method_registry.py)",
    "iter-fisher-lean": "the lean Iter-Fisher compensator (ferret_core/compensation/lean.py)",
    "dc-asgd-a": "the DC-ASGD-a compensator (ferret_core/compensation/dc_asgd.py)",
    "--plan": "the compensator ablation on a fixed plan (ferret simulate --plan FILE)",
}


class NotAvailableError(FerretError, LookupError):
    """A method, algorithm, compensator or option the bench needs is not in this checkout."""


@dataclass(frozen=True)
class Capabilities:
    """The names ``ferret simulate`` accepts here."""

    methods: tuple[str, ...]
    algorithms: tuple[str, ...]
    compensators: tuple[str, ...]
    fixed_plan: bool  # simulate --plan FILE

    @classmethod
    def from_parser(cls, ferret: argparse.ArgumentParser) -> Capabilities:
        """Read from the ``ferret`` command's parser (``services.cli.main.build_parser()``; passed in, as
        nothing below the CLI imports it)."""
        simulate = _subparser(ferret, "simulate")
        options = {opt: action for action in simulate._actions for opt in action.option_strings}
        algorithms = options.get("--algorithm")
        return cls(
            methods=tuple(options["--method"].choices or ()),
            algorithms=tuple(algorithms.choices or ()) if algorithms is not None else ("vanilla",),
            compensators=tuple(options["--compensator"].choices or ()),
            fixed_plan="--plan" in options,
        )

    def missing(self, spec: ExperimentSpec) -> list[str]:
        """Each name or option ``spec`` needs that this checkout lacks, as a sentence."""
        needs: list[tuple[str, str, Iterable[str]]] = []
        for arm in spec.arms:
            needs.append(("method", arm.method, self.methods))
            needs.append(("OCL algorithm", arm.algorithm, self.algorithms))
            if arm.compensator is not None:
                needs.append(("compensator", arm.compensator, self.compensators))
            if arm.fixed_plan and not self.fixed_plan:
                needs.append(("option", "--plan", ()))
            if arm.budget in ("M", "M-", "sweep2", "sweep4"):
                needs.append(("method", "pipedream-2bw", self.methods))  # budget M is its measured bytes
        out: list[str] = []
        for kind, name, offered in needs:
            if name in offered:
                continue
            sentence = _sentence(kind, name, tuple(offered))
            if sentence not in out:
                out.append(sentence)
        return out

    def check(self, spec: ExperimentSpec) -> None:
        """Raise :class:`NotAvailableError` naming every missing name; nothing runs."""
        missing = self.missing(spec)
        if missing:
            raise NotAvailableError(
                f"experiment {spec.name!r} cannot run on this checkout: "
                + "; ".join(missing)
                + ". Run it once those land on main, or pass --only-available to run the rest and list what was "
                "left out"
            )

    def runnable(self, spec: ExperimentSpec) -> tuple[ExperimentSpec, list[str]]:
        """``spec`` without the arms this checkout cannot run, and why each was left out."""
        kept, dropped = [], []
        for arm in spec.arms:
            single = dataclasses.replace(spec, arms=(arm,))
            reasons = self.missing(single)
            if reasons:
                dropped.append(f"{arm.label} at {arm.budget}: " + "; ".join(reasons))
            else:
                kept.append(arm)
        if not kept:
            raise NotAvailableError(
                f"experiment {spec.name!r}: no arm can run on this checkout: " + " | ".join(dropped)
            )
        return dataclasses.replace(spec, arms=tuple(kept)), dropped


def _sentence(kind: str, name: str, offered: tuple[str, ...]) -> str:
    source = PROVIDERS.get(name, "a part of Ferret this checkout lacks")
    if kind == "option":
        return f"ferret simulate has no {name} (it comes with {source})"
    if kind == "method" and name == "pipedream-2bw":
        return (
            f"budget M is the measured bytes of method 'pipedream-2bw', which ferret simulate --method does not "
            f"offer (offers: {', '.join(offered)}; it comes with {source})"
        )
    return f"{kind} {name!r} is not registered (offers: {', '.join(offered) or 'none'}; it comes with {source})"


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and name in action.choices:
            sub: argparse.ArgumentParser = action.choices[name]
            return sub
    raise NotAvailableError(f"this checkout's ferret has no {name!r} command")
