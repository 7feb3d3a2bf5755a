"""``ferret control``: talk to a running trainer's control plane over gRPC.

``ferret control [--target HOST:PORT] [--token T] [--tls-ca FILE] ACTION`` with ACTION one of
``budget BYTES|none``, ``plan``, ``status``, ``watch``, ``snapshot``, ``restore VERSION``, ``snapshots``.
Exit statuses (DESIGN §4): 0 ok; 3 infeasible budget (FAILED_PRECONDITION; the message names the
minimum); 2 usage errors and INVALID_ARGUMENT; 1 any other failure, printed as "CODE: details".
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import TYPE_CHECKING, Any

from services import strict_json
from services.cli.args import budget_or_unconstrained_type, existing_file, positive_float
from services.units import format_bytes

if TYPE_CHECKING:
    from services.control.client import ControlClient
    from services.proto_gen.ferret.v1 import control_pb2 as pb

EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_INFEASIBLE = 0, 1, 2, 3
TARGET_ENV = "FERRET_CONTROL_TARGET"
TOKEN_ENV = "FERRET_CONTROL_TOKEN"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "control",
        help="change the memory budget, read the plan and status, manage snapshots of a running trainer",
        description=(
            "A client of the trainer's gRPC control plane (ferret.v1.Control). Exit status 3 when a budget "
            "is below the minimum feasible (the message names it), 2 for usage errors and invalid "
            "arguments, 1 for any other failure."
        ),
    )
    parser.add_argument(
        "--target",
        default=os.environ.get(TARGET_ENV, "127.0.0.1:50051"),
        help=f"HOST:PORT of the control plane (default ${TARGET_ENV} or 127.0.0.1:50051)",
    )
    parser.add_argument(
        "--token",
        default=os.environ.get(TOKEN_ENV),
        help=f"bearer token when the server requires one (default ${TOKEN_ENV}; the env var keeps it out of ps)",
    )
    parser.add_argument(
        "--tls-ca", type=existing_file, default=None, help="PEM CA file: connect with TLS (default: plaintext)"
    )
    parser.add_argument("--timeout", type=positive_float, default=30.0, help="seconds per call (default 30)")
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True

    budget = actions.add_parser(
        "budget",
        help="re-plan for a new memory budget (or none) and apply it live",
        description="Re-plan for a new memory budget and apply it live; `none` (or `unconstrained`) drops the "
        "budget and plans unconstrained (the paper's M+).",
    )
    budget.add_argument(
        "budget",
        type=budget_or_unconstrained_type,
        metavar="BYTES|none",
        help="bytes, or with a suffix: 512MiB, 2GB; or none / unconstrained for no budget",
    )
    budget.add_argument("--json", action="store_true", help="print the applied plan as JSON")
    budget.set_defaults(action_handler=_run_budget)

    plan = actions.add_parser("plan", help="print the plan in force")
    plan.add_argument("--json", action="store_true", help="print Plan.to_dict() plus plan_version and timings")
    plan.set_defaults(action_handler=_run_plan)

    status = actions.add_parser("status", help="counters, online accuracy, memory and lag, now")
    status.add_argument("--json", action="store_true", help="print the StatusReply as JSON")
    status.set_defaults(action_handler=_run_status)

    watch = actions.add_parser("watch", help="print the status every interval until Ctrl-C")
    watch.add_argument("--interval", type=positive_float, default=1.0, help="seconds between updates (default 1)")
    watch.add_argument("--count", type=int, default=None, help="stop after N updates (default: until Ctrl-C)")
    watch.add_argument("--json", action="store_true", help="one JSON object per line")
    watch.set_defaults(action_handler=_run_watch)

    snapshot = actions.add_parser("snapshot", help="write a snapshot now")
    snapshot.add_argument(
        "--meta", action="append", default=[], metavar="KEY=VALUE", help="manifest metadata, repeatable (default: none)"
    )
    snapshot.set_defaults(action_handler=_run_snapshot)

    restore = actions.add_parser("restore", help="load a snapshot into the running trainer")
    restore.add_argument("version", type=_version_type, metavar="VERSION", help="a version, or 'latest'")
    restore.set_defaults(action_handler=_run_restore)

    snapshots = actions.add_parser("snapshots", help="list the snapshots, newest first")
    snapshots.add_argument("--verify", action="store_true", help="read every chunk and check its checksum")
    snapshots.add_argument("--json", action="store_true", help="print the ListSnapshotsReply as JSON")
    snapshots.set_defaults(action_handler=_run_snapshots)

    # main() calls run(), which connects and calls the action's handler, mapping failed calls to exit statuses.
    parser.set_defaults(handler=run)


def _version_type(text: str) -> int | None:
    if text.strip().lower() == "latest":
        return None
    try:
        version = int(text)
    except ValueError:
        version = 0
    if version < 1:
        raise argparse.ArgumentTypeError(f"expected a snapshot version >= 1 or 'latest', got {text!r}")
    return version


def run(args: argparse.Namespace) -> int:
    """Connect, run the action, and turn a failed call into the exit status."""
    import grpc

    from services.control.client import ControlCallError, ControlClient

    action = args.action_handler
    try:
        with ControlClient(args.target, token=args.token, tls_ca=args.tls_ca, timeout_s=args.timeout) as client:
            return int(action(client, args))
    except ControlCallError as exc:
        minimum = ""
        if exc.min_feasible_bytes is not None:  # from the reply's rich error details
            minimum = (
                f" [minimum feasible budget: {exc.min_feasible_bytes} bytes ({format_bytes(exc.min_feasible_bytes)})]"
            )
        print(f"ferret control: {exc.code.name}: {exc.details}{minimum}", file=sys.stderr)
        if exc.code == grpc.StatusCode.FAILED_PRECONDITION and exc.method == "SetMemoryBudget":
            return EXIT_INFEASIBLE
        if exc.code == grpc.StatusCode.INVALID_ARGUMENT:
            return EXIT_USAGE
        return EXIT_FAILURE


# -- actions ------------------------------------------------------------------------------------------
def _run_budget(client: ControlClient, args: argparse.Namespace) -> int:
    reply = client.set_memory_budget(args.budget)
    print(_plan_json(reply) if args.json else format_plan_reply(reply, title="Applied"))
    return EXIT_OK


def _run_plan(client: ControlClient, args: argparse.Namespace) -> int:
    reply = client.get_plan()
    print(_plan_json(reply) if args.json else format_plan_reply(reply))
    return EXIT_OK


def _run_status(client: ControlClient, args: argparse.Namespace) -> int:
    reply = client.get_status()
    print(_message_json(reply, indent=2) if args.json else format_status(reply))
    return EXIT_OK


def _run_watch(client: ControlClient, args: argparse.Namespace) -> int:
    if not args.json:
        print(WATCH_HEADER)
    for reply in client.watch_status(args.interval, args.count):
        print(_message_json(reply) if args.json else format_status_line(reply), flush=True)
    return EXIT_OK


def _run_snapshot(client: ControlClient, args: argparse.Namespace) -> int:
    metadata = {}
    for item in args.meta:
        key, sep, value = item.partition("=")
        if not sep or not key:
            print(f"ferret control: --meta expects KEY=VALUE, got {item!r}", file=sys.stderr)
            return EXIT_USAGE
        metadata[key] = value
    info = client.save_snapshot(metadata)
    print(f"snapshot v{info.version} written: {format_snapshot(info)}, in {info.seconds:.3f} s")
    return EXIT_OK


def _run_restore(client: ControlClient, args: argparse.Namespace) -> int:
    reply = client.restore_snapshot(args.version)
    print(f"restored snapshot v{reply.snapshot.version} in {reply.seconds:.3f} s: {format_snapshot(reply.snapshot)}")
    print(format_plan_reply(reply.plan))
    return EXIT_OK


def _run_snapshots(client: ControlClient, args: argparse.Namespace) -> int:
    reply = client.list_snapshots(args.verify)
    if args.json:
        print(_message_json(reply, indent=2))
        return EXIT_OK
    if not reply.snapshots:
        print("no snapshots")
        return EXIT_OK
    print(f"{'version':>7}  {'created (UTC)':<19}  {'chunks':>6}  {'size':>10}  {'plan':>5}  valid")
    for info in reply.snapshots:
        valid = "yes" if info.valid else f"NO: {info.error}"
        print(
            f"{info.version:>7}  {_utc(info.created_time_ms):<19}  {info.chunks:>6}  "
            f"{format_bytes(info.total_bytes):>10}  {'v' + str(info.plan_version):>5}  {valid}"
        )
    print(f"latest valid: {reply.latest_version or 'none'}")
    return EXIT_OK


# -- formatting ---------------------------------------------------------------------------------------
def _message_json(message: Any, indent: int | None = None) -> str:
    from google.protobuf import json_format

    data = json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    return strict_json.dumps(data, indent=indent)


def _plan_json(reply: pb.PlanReply) -> str:
    """``ferret plan --json``'s schema (Plan.to_dict()) plus the version and timings of the reply."""
    data = json.loads(reply.plan_json)
    data.update(
        plan_version=reply.plan_version,
        applied_time_ms=reply.applied_time_ms,
        planning_seconds=reply.planning_seconds,
        stall_seconds=reply.stall_seconds,
    )
    return strict_json.dumps(data, indent=2)


def _utc(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000)) if ms else "-"


def format_plan_reply(reply: pb.PlanReply, title: str = "Plan") -> str:
    """A compact readable plan (the server has no profile to name units: stages list unit indices)."""
    from services.cli.plan_cmd import host_lines
    from services.control.messages import plan_from_reply

    plan = plan_from_reply(reply)
    budget = "unconstrained (M+)" if plan.budget_bytes is None else format_bytes(plan.budget_bytes)
    timing = ""
    if reply.planning_seconds or reply.stall_seconds:
        timing = f"; planning {reply.planning_seconds * 1e3:.3g} ms, stall {reply.stall_seconds * 1e3:.3g} ms"
    lines = [
        f"{title} v{reply.plan_version} for {plan.model} (applied {_utc(reply.applied_time_ms)} UTC{timing})",
        f"  budget {budget}; planned {format_bytes(plan.planned_bytes)}; "
        f"minimum feasible {format_bytes(plan.min_feasible_bytes)}; R_F = {plan.adaptation_rate:.6g}",
        *host_lines(plan),
        f"  {plan.num_stages} stages (t^f = {plan.stage_forward_time * 1e3:.4g} ms, "
        f"t^b = {plan.stage_backward_time * 1e3:.4g} ms), {plan.num_workers} worker slots, "
        f"{plan.live_workers} live; t^d = {plan.arrival_interval * 1e3:.4g} ms; memory model "
        f"{plan.memory_model}, {plan.dtype}",
        "  stage  units",
        *(f"  {j:>5}  {', '.join(map(str, stage))}" for j, stage in enumerate(plan.stages)),
        "  worker  state    T1 recompute  T2 accumulation c^a  T3 omission c^o",
    ]
    for w in plan.workers:
        lines.append(
            f"  {w.index:>6}  {'live' if w.live else 'removed':<7}  {'on' if w.recompute else 'off':<12}  "
            f"{' '.join(map(str, w.accumulation)):<20} {' '.join(map(str, w.omission))}"
        )
    if plan.recompute_note:
        lines.append(f"  why: {plan.recompute_note}")
    for step in plan.steps:
        lines.append(f"    {step.kind} worker {step.worker}: {step.detail}; saves {format_bytes(-step.delta_bytes)}")
    return "\n".join(lines)


def format_snapshot(info: pb.SnapshotInfo) -> str:
    sha = f", sha256 {info.sha256[:12]}…" if info.sha256 else ""
    offsets = ", ".join(f"{o.topic}[{o.partition}]@{o.offset}" for o in info.offsets)
    return (
        f"{info.chunks} chunks, {format_bytes(info.total_bytes)}{sha}, plan v{info.plan_version}, "
        f"created {_utc(info.created_time_ms)} UTC" + (f", offsets {offsets}" if offsets else "")
    )


def _state(reply: pb.StatusReply) -> str:
    from services.proto_gen.ferret.v1 import control_pb2

    return control_pb2.ServiceState.Name(reply.state).removeprefix("SERVICE_STATE_").lower()


def format_status(reply: pb.StatusReply) -> str:
    budget = format_bytes(reply.budget_bytes) if reply.HasField("budget_bytes") else "unconstrained"
    skipped = ", ".join(f"{k}={v}" for k, v in sorted(reply.items_skipped.items())) or "none"
    lines = [
        f"state {_state(reply)}, plan v{reply.plan_version}, model v{reply.model_version}, "
        f"up {reply.uptime_s:.1f} s{', instance ' + reply.instance_id if reply.instance_id else ''}",
        f"  items        received {reply.items_received}, valid {reply.items_valid}, dead-lettered "
        f"{reply.items_dead_lettered}, dispatched {reply.items_dispatched}",
        f"  predictions  published {reply.predictions_published} (duplicates {reply.duplicates_published}); "
        f"online accuracy {reply.online_accuracy:.2f} % "
        f"({reply.correct_predictions}/{reply.labelled_predictions} labelled)",
        f"  training     backward passes {reply.backward_passes}; skipped {skipped}; "
        f"re-plans {reply.replans}, pauses {reply.pauses}",
        f"  memory       budget {budget}, planned {format_bytes(reply.predicted_bytes)}, "
        f"measured {format_bytes(reply.measured_bytes)}",
        f"  lag          {reply.lag_items} items, {reply.lag_seconds:.3f} s; {reply.items_per_second:.1f} items/s; "
        f"latency p50 {reply.latency_ms_p50:.2f} ms, p99 {reply.latency_ms_p99:.2f} ms",
        f"  snapshots    last v{reply.last_snapshot_version}",
        f"  guard        last-good v{reply.last_good_version}, rollbacks {reply.rollbacks}, "
        f"promotions {reply.promotions}, drifts {reply.drifts}",
    ]
    if reply.counters:
        lines.append("  counters     " + ", ".join(f"{k}={v}" for k, v in sorted(reply.counters.items())))
    return "\n".join(lines)


WATCH_HEADER = (
    f"{'time (UTC)':<19}  {'state':<12}  {'plan':>4}  {'items':>9}  {'preds':>9}  {'oacc %':>6}  "
    f"{'lag':>6}  {'measured':>10}  {'p99 ms':>7}"
)


def format_status_line(reply: pb.StatusReply) -> str:
    return (
        f"{_utc(reply.time_ms):<19}  {_state(reply):<12}  {reply.plan_version:>4}  {reply.items_received:>9}  "
        f"{reply.predictions_published:>9}  {reply.online_accuracy:>6.2f}  {reply.lag_items:>6}  "
        f"{format_bytes(reply.measured_bytes):>10}  {reply.latency_ms_p99:>7.2f}"
    )
