"""``ferret demo``: the whole service on this machine, end to end (DESIGN §6).

    ferret demo                                   # MNIST (or digits) through Kafka, ~1 minute
    ferret demo --items 300 --dataset digits --model mlp --no-live --out /tmp/demo

Starts the local broker and Redis (or uses ``--bootstrap-servers`` / ``--redis-url``), creates fresh
topics, runs ``ferret run`` and ``ferret produce`` as separate processes, shows the trainer's status live,
changes the memory budget once over gRPC mid-stream, snapshots, stops everything and writes a report
(summary.json, report.md, online_accuracy.png, the children's logs) to ``--out``. Exit status 0 on
success, 3 when a budget is infeasible, 1 with a one-line reason (and the failing part's log tail) when a
part fails, 130 on Ctrl-C (after stopping every child).

Diagnostics: ``kill -USR1 <demo pid>`` prints every thread's Python stack to the demo's stderr (the demo
keeps running), e.g. to see where a slow stop waits.
"""

from __future__ import annotations

import argparse
import faulthandler
import logging
import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

from ferret_core.data import DATASET_NAMES
from services.cli.args import budget_type, fraction, positive_float, positive_int
from services.cli.logs import add_logging_arguments, configure_logging
from services.config.data_root import default_data_root
from services.demo.options import (
    DEFAULT_CHANGE_AT,
    DEFAULT_ITEMS,
    DEFAULT_RATE,
    DEFAULT_SNAPSHOT_INTERVAL_S,
    RATE_OVER_PLAIN,
    DemoOptions,
    committed_profile,
    default_out_dir,
    fresh_topic_prefix,
    resolve_dataset,
    resolve_model,
    run_stamp,
)
from services.models import MODEL_HELP, model_spec_type

log = logging.getLogger("ferret.demo")
EXIT_OK = 0
EXIT_FAILURE = 1
LOG_TAIL_LINES = 15


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="run producer → Kafka → trainer → predictions end to end, with a budget change and a report",
        description=(
            "Start the local broker and Redis, stream a dataset through `ferret produce` into a `ferret run` "
            "trainer (separate processes), show the live status, change the memory budget once over gRPC, "
            "snapshot, stop cleanly and write a report (summary.json, report.md, a PNG) to --out."
        ),
    )
    parser.add_argument(
        "--dataset",
        choices=DATASET_NAMES,
        default=None,
        metavar="NAME",
        help="dataset to stream (default: mnist when <data root>/MNIST/raw exists, else digits)",
    )
    parser.add_argument(
        "--model",
        type=model_spec_type,
        default=None,
        metavar="MODEL",
        help=f"{MODEL_HELP} (default: mnistnet for 28x28 images, else mlp)",
    )
    parser.add_argument("--data-root", type=Path, default=None, help="data folder (default ../shared/data or cache)")
    parser.add_argument("--items", type=positive_int, default=DEFAULT_ITEMS, help=f"items to stream ({DEFAULT_ITEMS})")
    parser.add_argument(
        "--rate",
        type=positive_float,
        default=None,
        metavar="ITEMS_PER_S",
        help=f"producer rate in items/s (default: {RATE_OVER_PLAIN:g}x what a plain loop trains per second on this "
        f"machine, measured at start, where the trainer runs executor processes; else {DEFAULT_RATE:g})",
    )
    parser.add_argument(
        "--budget",
        type=budget_type,
        default=None,
        help="initial memory budget: bytes or 512MiB (default unconstrained)",
    )
    parser.add_argument(
        "--new-budget",
        type=budget_type,
        default=None,
        help="budget set mid-stream over gRPC (default: halfway between minimum feasible and planned bytes; "
        "when the plan is already the smallest feasible, half the minimum, to show the refusal)",
    )
    parser.add_argument(
        "--change-at",
        type=fraction,
        default=DEFAULT_CHANGE_AT,
        metavar="FRACTION",
        help=f"change the budget once this fraction of the items was predicted ({DEFAULT_CHANGE_AT:g})",
    )
    parser.add_argument(
        "--bootstrap-servers", default=None, metavar="HOST:PORT", help="use this Kafka (default: embedded)"
    )
    parser.add_argument("--redis-url", default=None, metavar="URL", help="use this Redis (default: embedded)")
    parser.add_argument("--out", type=Path, default=None, metavar="DIR", help="report folder (default out/demo-<time>)")
    parser.add_argument(
        "--snapshot-interval",
        type=positive_float,
        default=DEFAULT_SNAPSHOT_INTERVAL_S,
        metavar="S",
        help=f"seconds between the trainer's periodic snapshots (default {DEFAULT_SNAPSHOT_INTERVAL_S:g})",
    )
    parser.add_argument("--no-live", action="store_true", help="plain progress lines instead of the live table")
    parser.add_argument(
        "--no-plain-consumer",
        action="store_true",
        help="skip the live plain consumer that runs after Ferret on the same items and rate (the report then "
        "compares Ferret with the replayed plain loop only)",
    )
    parser.add_argument(
        "--keep-stack",
        action="store_true",
        help="leave the broker, Redis and the trainer running at the end and print how to reach the topics, "
        "the control plane and the metrics (Ctrl-C still stops everything)",
    )
    add_logging_arguments(parser, level="INFO")
    parser.set_defaults(handler=run)


def default_rate(dataset: str, model: str) -> float:
    """The demo's stream rate without ``--rate``: :data:`RATE_OVER_PLAIN` × the plain loop's measured rate
    where the trainer will train on executor processes (≥ 2 cores, an item of ≥ 1 ms: docs/service.md
    "Executors"), the stream Ferret's workers are for; else (a tiny model such as the digits MLP, or one
    core) :data:`DEFAULT_RATE`, where one worker keeps up: above the plain loop's rate the thread trainer
    trains fewer items than the loop (measured: digits/MLP at 2691 items/s, 16.7 % online accuracy against
    the replayed plain loop's 52.0 %)."""
    from services.demo.baseline import plain_loop_rate  # torch: only when the demo runs
    from services.trainer.executors import PROCESS_MIN_ITEM_S

    plain = plain_loop_rate(dataset, model)
    if 1.0 / plain < PROCESS_MIN_ITEM_S or (os.cpu_count() or 1) < 2:
        log.info("stream rate %g items/s: %s trains on threads here (plain loop %.0f/s)", DEFAULT_RATE, model, plain)
        return DEFAULT_RATE
    rate = round(RATE_OVER_PLAIN * plain)
    log.info("stream rate %d items/s: %g x the %.0f items/s a plain loop trains here", rate, RATE_OVER_PLAIN, plain)
    return float(rate)


def options_from_args(args: argparse.Namespace, stamp: str | None = None) -> DemoOptions:
    """Resolve the defaults (dataset, model, profile, out dir, topic prefix) for the given flags."""
    stamp = stamp or run_stamp()
    data_root = args.data_root if args.data_root is not None else default_data_root()
    dataset = resolve_dataset(args.dataset, data_root)
    if args.dataset is None and dataset == "digits":
        log.info(
            "dataset digits (scikit-learn's bundled 8x8 digits): no MNIST under the data root %s (%s missing); "
            "pass --data-root DIR with MNIST/raw in it (README, Data) or --dataset NAME",
            data_root,
            data_root / "MNIST" / "raw",
        )
    model = resolve_model(args.model, dataset)
    return DemoOptions(
        dataset=dataset,
        model=model,
        out_dir=args.out if args.out is not None else default_out_dir(stamp),
        topic_prefix=fresh_topic_prefix(stamp),
        data_root=data_root,
        profile=committed_profile(model, dataset),
        items=args.items,
        rate=args.rate if args.rate is not None else default_rate(dataset, model),
        budget=args.budget,
        new_budget=args.new_budget,
        change_at=args.change_at,
        bootstrap_servers=args.bootstrap_servers,
        redis_url=args.redis_url,
        live=not args.no_live,
        plain_consumer=not args.no_plain_consumer,
        snapshot_interval_s=args.snapshot_interval,
        keep_stack=args.keep_stack,
        log_format=args.log_format,
    )


def run(args: argparse.Namespace) -> int:
    configure_logging(args.log_level, args.log_format)
    options = options_from_args(args)
    from services.demo.orchestrator import DemoError, DemoRun  # grpc, kafka: only when the demo runs
    from services.demo.report import table_rows

    profile = f"profile {options.profile}" if options.profile else "profiled at start-up"
    budget = "unconstrained" if options.budget is None else f"{options.budget} bytes"
    intro = (
        f"ferret demo: {options.items} {options.dataset} items at {options.rate:g}/s through {options.model} "
        f"({profile}); budget {budget}, changed after {options.change_at:.0%} of the predictions; "
        f"report in {options.out_dir}"
    )
    json_logs = args.log_format == "json"
    if json_logs:
        log.info(intro)
    else:
        print(intro, file=sys.stderr, flush=True)
    demo = DemoRun(options)
    if hasattr(signal, "SIGUSR1"):  # kill -USR1 <pid>: every thread's stack to stderr, the demo goes on
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    try:
        with interrupt_on_signals():
            summary = demo.run()
    except DemoError as exc:
        from services.localstack.process import log_tail

        tail = log_tail(exc.log_path, LOG_TAIL_LINES) if exc.log_path is not None else ""
        if json_logs:
            log.error(str(exc), extra={"log_path": str(exc.log_path), "log_tail": tail.splitlines()})
            return EXIT_FAILURE
        print(f"ferret: error: {exc}", file=sys.stderr)
        if exc.log_path is not None and tail:
            print(f"last lines of {exc.log_path}:", file=sys.stderr)
            print("\n".join(f"  | {line}" for line in tail.splitlines()), file=sys.stderr)
        return EXIT_FAILURE
    _print_table(table_rows(summary))
    files = summary["files"]
    print(f"\nreport: {files['report']}\nsummary: {files['summary']}\nplot: {files.get('plot', 'none')}")
    if demo.kept is not None:
        print(f"\n{demo.kept.describe()}")
    return EXIT_OK


def _print_table(rows: list[tuple[str, str]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="ferret demo", show_header=True, header_style="bold")
    table.add_column("what", style="cyan", no_wrap=True)
    table.add_column("value")
    for what, value in rows:
        table.add_row(what, value)
    Console(file=sys.stdout, width=max(110, Console().width)).print(table)


@contextmanager
def interrupt_on_signals() -> Iterator[None]:
    """SIGINT (Ctrl-C) and SIGTERM both raise ``KeyboardInterrupt``: the demo stops its children in order
    and exits 130 (main thread only).

    SIGINT is set here, not left to Python: a process started with SIGINT *ignored* (a background job of a
    script, ``cmd &``; ``nohup``; CI runners that start the tests that way) passes the ignore on to its
    children, and Python installs its KeyboardInterrupt handler only where SIGINT was at its default. Such a
    demo ignored Ctrl-C and kept streaming (docs/reliability.md, "Ctrl-C ignored"); ``ferret run`` and
    ``ferret produce`` already set their own handlers the same way.
    """

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
