"""``ferret plan``: print the plan for a model, a profile and a memory budget."""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path

from ferret_core.compensation import COMPENSATOR_NAMES
from ferret_core.engine.steps import Algorithm
from ferret_core.errors import ConfigError
from ferret_core.ocl import ALGORITHM_NAMES, AlgorithmSettings, make_algorithm
from ferret_core.ocl.planning import planning_memory, planning_profile
from ferret_core.plan import Plan
from ferret_core.planning.host_memory import HostBudget
from ferret_core.planning.memory_model import IN_FLIGHT_MODES, MEMORY_VARIANTS, OPTIMIZER_SLOTS, MemorySettings
from ferret_core.planning.placement import serving_hosts
from ferret_core.planning.planner import OBJECTIVES, Planner, PlannerSettings
from ferret_core.planning.staleness_cost import StalenessCost
from ferret_core.profile import DTYPE_BYTES, ModelProfile
from services import strict_json
from services.cli.args import arrival_interval_type, budget_type, existing_file, non_negative_float, positive_int
from services.cli.calibration import load_cost
from services.models import MODEL_HELP, build_model_for, check_model_spec, is_factory, model_spec_type, shape_type
from services.units import ArrivalInterval, format_bytes

COMPENSATOR_CHOICES = COMPENSATOR_NAMES
# what the planner counts and simulate applies to Ferret when --compensator is not given: the lean variant
# gave Iter-Fisher's accuracy at 20 % of its state bytes (docs/planner.md); "iter-fisher" is Algorithm 1
PLANNER_COMPENSATOR = "iter-fisher-lean"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="plan partitions and pipeline configuration for a memory budget",
        description=(
            "Profile (or load the profile of) a model and run Ferret's planner (Alg. 2 + Alg. 3). "
            "Planning needs no weights: `--profile FILE` alone plans any model, your own included. "
            "No --budget means unconstrained (the paper's M+). Exit status 3 when the budget is infeasible."
        ),
    )
    add_planning_arguments(parser)
    parser.add_argument(
        "--algorithm",
        choices=ALGORITHM_NAMES,
        default="vanilla",
        help="OCL algorithm whose step (micro-batch, LwF's second forward, MIR's retrieval) and state (replay "
        "buffer, teacher, importances) are planned, as `ferret simulate --algorithm` plans them (default vanilla)",
    )
    add_replay_arguments(parser)
    parser.add_argument(
        "--hosts",
        type=positive_int,
        default=None,
        metavar="H",
        help="plan for a job of H hosts as `ferret run` with trainer.hosts: torchrun runs it (executor processes, "
        "stage j on rank 1 + ⌊j·(H − 1)/P⌋, P ≤ H − 1) and print the planned bytes per host (rank 0: the record "
        "path and follower copies of the other hosts' stages); default: one host",
    )
    parser.add_argument(
        "--host-budget",
        type=budget_type,
        default=None,
        help="with --hosts: every host's own memory budget (trainer.host_budget_bytes; default: none); --budget "
        "stays the job's",
    )
    parser.add_argument("--json", action="store_true", help="print the plan as JSON instead of the table")
    parser.set_defaults(handler=run)


def add_planning_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments shared by every command that plans (plan, simulate, run)."""
    parser.add_argument(
        "--model",
        type=model_spec_type,
        default=None,
        metavar="MODEL",
        help=f"{MODEL_HELP}; optional with --profile (default: the profile's model)",
    )
    parser.add_argument(
        "--budget", type=budget_type, default=None, help="memory budget: bytes, or 512MiB, 2GB (default unconstrained)"
    )
    parser.add_argument(
        "--profile",
        type=existing_file,
        default=None,
        help="profile JSON of `ferret profile` (default: profile now, as `ferret profile` does with its defaults: "
        "one torch thread, the same timer)",
    )
    parser.add_argument(
        "--input-shape",
        type=shape_type,
        default=None,
        metavar="C,H,W",
        help="per-sample input shape for profiling your own model now, without --profile (e.g. 1,28,28; "
        "default: the dataset's in simulate, else required for your own model)",
    )
    parser.add_argument(
        "--arrival-interval",
        type=arrival_interval_type,
        default=ArrivalInterval(multiple=1.0),
        help="t^d: 'auto' (= max_i t̂_i^f, the paper's rate, default), 'Kx' or seconds",
    )
    parser.add_argument(
        "--decay",
        type=non_negative_float,
        default=None,
        help="decay constant c (default ln2/T: data value halves over one sequential forward and backward)",
    )
    parser.add_argument(
        "--dtype",
        choices=sorted(DTYPE_BYTES),
        default="float32",
        help="element type of the byte model (default float32)",
    )
    parser.add_argument(
        "--input-size",
        type=int,
        choices=(32, 224),
        default=None,
        help="image side of resnet18/mobilenet when profiling now (default: the model's own, 32)",
    )
    parser.add_argument("--num-classes", type=int, default=10, help="output classes when profiling now (default 10)")
    parser.add_argument(
        "--memory-model",
        choices=MEMORY_VARIANTS,
        default="engine",
        help="byte model: engine (what the engine holds: a budget it keeps; default) or paper (eq. ferret-svre "
        "plus the extras, the paper's planning model, not a bound on measured memory)",
    )
    parser.add_argument(
        "--in-flight",
        choices=IN_FLIGHT_MODES,
        default=None,
        help="engine model: count items in flight from the 1F1B cap (any clock; default of plan and run) or "
        "from a replay of the virtual clock's schedule (default of simulate)",
    )
    parser.add_argument(
        "--compensator",
        choices=COMPENSATOR_CHOICES,
        default=None,
        help=f"stale-gradient compensator whose state is counted (default {PLANNER_COMPENSATOR}); simulate applies "
        "it to Ferret by default and to the other methods only when given",
    )
    parser.add_argument(
        "--optimizer",
        choices=sorted(OPTIMIZER_SLOTS),
        default="sgd",
        help="optimizer whose state is counted (default sgd)",
    )
    parser.add_argument(
        "--max-workers", type=int, default=None, help="cap N by the executors that exist (default: no cap)"
    )
    parser.add_argument(
        "--objective",
        choices=OBJECTIVES,
        default="rate",
        help="what the plan maximises: rate (R_F, the paper's; default) or accuracy (R_F discounted by the "
        "measured cost of staleness, so a worker is added only when the items it trains are worth more than the "
        "staleness it adds; needs --staleness-cost, which simulate calibrates on the stream's head when absent)",
    )
    parser.add_argument(
        "--staleness-cost",
        type=existing_file,
        default=None,
        metavar="FILE",
        help="a measured staleness cost (the JSON `ferret simulate --objective accuracy` caches under "
        "CACHE/staleness/): the accuracy objective's d(τ); `plan` prints both objectives with it (default: none; "
        "simulate then calibrates)",
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="device to profile on (default cpu)")


def load_or_profile(
    args: argparse.Namespace, input_shape: tuple[int, ...] | None = None, batch_sizes: Sequence[int] = ()
) -> ModelProfile:
    """The profile of ``--profile`` (its model must be ``--model`` when both are given; checked against the
    model's ``input_shape`` when given), else the model ``--model`` names profiled now (your own model needs
    ``--input-shape``), with step times for the mini-batch ``batch_sizes`` too, by ``ferret profile``'s
    own helper and defaults (:func:`services.cli.profiling.profile_now`: one torch thread, the same timer),
    so the plan is the one ``--profile`` of that command's file gives."""
    if args.profile is not None:
        profile = ModelProfile.load(args.profile)
        if args.model is not None and profile.model != args.model:
            raise ConfigError(
                f"profile {str(args.profile)!r} is for model {profile.model!r} but --model is {args.model!r}; "
                "pass the matching profile or omit --profile to profile now"
            )
        if input_shape is not None:
            profile.check_input(input_shape, source=f"profile {str(args.profile)!r}")
        return profile
    if args.model is None:
        raise ConfigError("give --model (a zoo name or package.module:factory) or --profile FILE")
    from ferret_core.zoo import build_model
    from services.cli.profiling import profile_now

    if is_factory(args.model) or args.input_shape is not None:
        if args.input_shape is None:
            raise ConfigError(f"--model {args.model} is your own factory: pass --input-shape (e.g. 1,28,28)")
        model = build_model_for(args.model, input_shape=args.input_shape, num_classes=args.num_classes)
    else:
        model = build_model(args.model, num_classes=args.num_classes, input_size=args.input_size)
    return profile_now(model, device=args.device, dtype=args.dtype, batch_sizes=batch_sizes)


def model_from_profile(args: argparse.Namespace) -> None:
    """Set ``args.model`` from ``--profile`` when only the profile was given."""
    if args.model is None and args.profile is not None:
        args.model = check_model_spec(ModelProfile.load(args.profile).model)


def staleness_cost_of(args: argparse.Namespace) -> StalenessCost | None:
    """The staleness cost of the arguments: one a command calibrated (``args.calibrated_cost``), else
    ``--staleness-cost FILE``, else ``None``."""
    given = getattr(args, "calibrated_cost", None)
    if isinstance(given, StalenessCost):
        return given
    path = getattr(args, "staleness_cost", None)
    return None if path is None else load_cost(path)


def planner_from_args(args: argparse.Namespace, profile: ModelProfile, *, in_flight: str = "cap") -> Planner:
    """The planner the arguments describe; ``in_flight`` is the command's default for ``--in-flight``."""
    cost = staleness_cost_of(args)
    objective = getattr(args, "objective", "rate")
    if objective == "accuracy" and cost is None:
        raise ConfigError(
            "--objective accuracy needs a measured staleness cost: pass --staleness-cost FILE (the JSON `ferret "
            "simulate --objective accuracy` writes under its --cache-dir, in staleness/), or run `ferret simulate "
            "--objective accuracy`, which calibrates one on the stream's head"
        )
    hosts = host_budget_of(args)
    memory = MemorySettings(
        variant=args.memory_model,
        in_flight=args.in_flight or in_flight,
        dtype=args.dtype,
        optimizer=args.optimizer,
        compensator=args.compensator or PLANNER_COMPENSATOR,
        executors="threads" if hosts is None else "processes",  # several hosts: executor processes (run's)
    )
    settings = PlannerSettings(
        arrival_interval=args.arrival_interval.resolve(profile.max_forward_time),
        decay=args.decay,
        memory=memory,
        max_workers=args.max_workers,
        max_stages=None if hosts is None else serving_hosts(hosts.hosts),
        objective=objective,
        staleness_cost=cost,
        hosts=hosts,
    )
    return Planner(profile, settings)


def host_budget_of(args: argparse.Namespace) -> HostBudget | None:
    """``--hosts H [--host-budget B]`` (``ferret plan``'s): the job's hosts and each one's budget."""
    hosts, budget = getattr(args, "hosts", None), getattr(args, "host_budget", None)
    if hosts is None:
        if budget is not None:
            raise ConfigError("--host-budget is a budget per host of a job: give the job's hosts with --hosts H")
        return None
    return HostBudget(hosts, budget)


def planner_for_algorithm(
    args: argparse.Namespace, profile: ModelProfile, algorithm: Algorithm, *, in_flight: str
) -> Planner:
    """The planner for ``algorithm``'s usual step: its micro-batch's times (and LwF's second forward,
    MIR's retrieval) and memory (micro-batch activations, replay buffer, teacher, importances; DESIGN
    §3.8), with the planning options of ``args``; ``in_flight`` is the command's default for
    ``--in-flight``. The arrival interval stays the stream's."""
    shape = algorithm.steady_shape(1)
    base = planner_from_args(args, profile, in_flight=in_flight).settings
    settings = dataclasses.replace(base, memory=planning_memory(base.memory, algorithm.footprint, shape))
    return Planner(planning_profile(profile, shape), settings)


def plan_for_algorithm(
    args: argparse.Namespace, profile: ModelProfile, algorithm: Algorithm, *, in_flight: str
) -> Plan:
    """The plan of :func:`planner_for_algorithm` for ``--budget``, with both objectives' view of it.
    ``ferret plan`` and ``ferret simulate`` both plan through here, so with the same options
    (``--in-flight`` and ``--objective`` included) they make the same plan."""
    planner = planner_for_algorithm(args, profile, algorithm, in_flight=in_flight)
    plan = planner.plan(args.budget)
    if plan.objectives is None:
        plan = dataclasses.replace(plan, objectives=planner.objectives(plan))
    return plan


def add_replay_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``--replay-buffer``, ``--replay-batch``, ``--mir-candidates`` (ER/MIR), as ``ferret plan`` and
    ``ferret simulate`` both take them."""
    defaults = AlgorithmSettings()
    parser.add_argument("--replay-buffer", type=positive_int, default=defaults.buffer_size,
                        help=f"ER/MIR buffer size in items (default {defaults.buffer_size}, the paper's)")
    parser.add_argument("--replay-batch", type=positive_int, default=None,
                        help="ER/MIR items replayed per step (default: as many as the step admits)")
    parser.add_argument("--mir-candidates", type=positive_int, default=None,
                        help="MIR candidates scored per step (default: 5 × the replayed items)")


def run(args: argparse.Namespace) -> int:
    profile = load_or_profile(args)
    if args.profile is not None and args.input_size is not None:  # the profile must be for that image size
        side = args.input_size
        profile.check_input((*profile.input_shape[:-2], side, side), source=f"profile {str(args.profile)!r}")
    settings = AlgorithmSettings(
        buffer_size=args.replay_buffer, replay_batch=args.replay_batch, mir_candidates=args.mir_candidates
    )
    plan = plan_for_algorithm(args, profile, make_algorithm(args.algorithm, settings), in_flight="cap")
    if args.json:
        print(strict_json.dumps(plan.to_dict(), indent=2))
    else:
        print(format_plan(plan, profile, source=args.profile))
    return 0


def format_plan(plan: Plan, profile: ModelProfile, source: Path | None = None) -> str:
    """A readable plan that says why each technique was applied."""
    names = [layer.name for layer in profile.layers]
    lines = [
        f"Plan for {plan.model} ({'profile ' + str(source) if source else 'profiled now on ' + profile.device}, "
        f"{profile.dtype})",
        f"  arrival interval t^d = {plan.arrival_interval * 1e3:.4g} ms, decay c = {plan.decay:.4g} /s",
        f"  memory model {plan.memory_note or plan.memory_model}",
        f"  budget {'unconstrained (M+)' if plan.budget_bytes is None else format_bytes(plan.budget_bytes)}; "
        f"minimum feasible {format_bytes(plan.min_feasible_bytes)}",
        f"  planned memory {format_bytes(plan.planned_bytes)} "
        f"(eq. ferret-svre alone: {plan.paper_memory_elements:,} elements); adaptation rate R_F = "
        f"{plan.adaptation_rate:.6g}",
        *_objective_lines(plan),
        *host_lines(plan),
        f"  {plan.num_stages} stages (t^f = {plan.stage_forward_time * 1e3:.4g} ms, "
        f"t^b = {plan.stage_backward_time * 1e3:.4g} ms), {plan.num_workers} worker slots, "
        f"{plan.live_workers} live",
        "",
        "  stage  units",
    ]
    for j, stage in enumerate(plan.stages):
        lines.append(f"  {j:>5}  {', '.join(names[u] for u in stage)}")
    lines += ["", "  worker  state    T1 recompute  T2 accumulation c^a  T3 omission c^o"]
    for w in plan.workers:
        state = "live" if w.live else "removed"
        lines.append(
            f"  {w.index:>6}  {state:<7}  {'on' if w.recompute else 'off':<12}  "
            f"{' '.join(map(str, w.accumulation)):<20} {' '.join(map(str, w.omission))}"
        )
    lines += ["", "  why:", f"    {plan.recompute_note}"]
    if not plan.steps:
        lines.append("    no T2/T3/T4 step was needed: the initial configuration fits the budget")
    for step in plan.steps:
        loss = -step.delta_rate
        ratio = "free" if loss <= 0 else f"{-step.delta_bytes / loss:.3g} B per unit of R_F"
        lines.append(
            f"    {step.kind} worker {step.worker}: {step.detail}; saves {format_bytes(-step.delta_bytes)}, "
            f"ΔR_F = {step.delta_rate:.3g} ({ratio})"
        )
    lines += ["", "  memory breakdown:"]
    for name, value in plan.memory_breakdown.items():
        lines.append(f"    {name:<20} {format_bytes(value)}")
    if not math.isfinite(plan.adaptation_rate):
        lines.append("  warning: the adaptation rate is not finite")
    return "\n".join(lines)


def host_lines(plan: Plan) -> list[str]:
    """The plan's planned bytes per host, where it was planned for several hosts (none otherwise)."""
    if not plan.host_bytes:
        return []
    each = ", ".join(
        f"rank {rank} {format_bytes(b)}{' (record path, follower copies)' if rank == 0 else ''}"
        for rank, b in enumerate(plan.host_bytes)
    )
    return [f"  planned bytes per host: {each}"]


def _objective_lines(plan: Plan) -> list[str]:
    """Both objectives of the plan (docs/planner.md reading 13), where the planner evaluated them."""
    o = plan.objectives
    if o is None:
        return []
    staleness = ", ".join(f"{t:.2f}" for t in o.expected_staleness)
    lines = [
        f"  chosen by the {o.objective} objective; expected staleness per stage [{staleness}] on the virtual clock, "
        f"{o.trained_fraction:.0%} of arrivals trained",
        f"  rate objective R_F = {o.rate:.6g}; accuracy objective R_F × d(τ) = "
        + (
            f"{o.accuracy:.6g} (discount {o.discount:.3f}; cost {o.cost_source or 'given'})"
            if o.accuracy is not None and o.discount is not None
            else "not evaluated (needs a measured staleness cost: --staleness-cost FILE)"
        ),
    ]
    return lines
