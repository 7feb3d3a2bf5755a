"""``ferret predictions tail``: print the predictions a trainer publishes, as a table or JSON lines.

    ferret predictions tail                              # new predictions as they come, until Ctrl-C
    ferret predictions tail --from-beginning --no-follow --json > predictions.jsonl
    ferret predictions tail --group dashboards           # a consumer group: shares partitions, commits

The broker and the topic prefix come from the settings (``--config``, ``FERRET_KAFKA_BOOTSTRAP_SERVERS``,
``FERRET_KAFKA_TOPIC_PREFIX``; security settings too) unless given as flags. Reading is
:func:`services.predictions.iter_predictions`; without ``--group`` nothing is committed.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TextIO

from services import strict_json
from services.cli.args import positive_float, positive_int
from services.predictions.records import PredictionRecord

TABLE_HEADER = (
    f"{'time (UTC)':<12}  {'part:offset':>11}  {'item':>7}  {'sample':<18}  {'pred':>4}  {'conf':>5}  {'label':>5}  "
    f"{'ok':<2}  {'decision':<14}  {'oacc %':>6}  {'lat ms':>7}  top-k (class:probability)"
)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "predictions",
        help="read the predictions a trainer publishes (<prefix>.predictions)",
        description="Downstream reading of <prefix>.predictions (ferret.v1.Prediction; docs/predictions.md).",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    tail = actions.add_parser(
        "tail",
        help="print predictions as they are published (or from the beginning), as a table or JSON lines",
        description=(
            "Print the predictions of <prefix>.predictions: by default the new ones as they come, until "
            "Ctrl-C, --max or --timeout. Without --group the reader is ephemeral: it assigns every partition "
            "itself and commits nothing. Exit status 1 when the topic does not exist or a record is not a "
            "ferret.v1.Prediction (see --skip-invalid)."
        ),
    )
    tail.add_argument("--config", type=Path, default=None, help="YAML settings file (default $FERRET_CONFIG)")
    tail.add_argument(
        "--bootstrap-servers",
        default=None,
        help="HOST:PORT[,...] of the broker (default: kafka.bootstrap_servers of the settings, 127.0.0.1:9092)",
    )
    tail.add_argument(
        "--topic-prefix", default=None, help="topic prefix (default: kafka.topic_prefix of the settings, ferret)"
    )
    tail.add_argument(
        "--from-beginning",
        action="store_true",
        help="start at the first prediction (default: the end, only new ones; a --group resumes where it was)",
    )
    tail.add_argument(
        "--follow",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="keep waiting for new predictions (default); --no-follow stops once none came for --idle-timeout",
    )
    tail.add_argument(
        "--group",
        default=None,
        metavar="NAME",
        help="read as a member of this consumer group and commit what was printed (default: no group, no commits)",
    )
    tail.add_argument(
        "--max", type=positive_int, default=None, metavar="N", help="stop after N predictions (default: no limit)"
    )
    tail.add_argument(
        "--timeout", type=positive_float, default=None, metavar="SECONDS", help="stop after this long (default: none)"
    )
    tail.add_argument(
        "--idle-timeout",
        type=positive_float,
        default=2.0,
        metavar="SECONDS",
        help="with --no-follow: caught up once no prediction came for this long (default 2)",
    )
    tail.add_argument("--json", action="store_true", help="one JSON object per line (default: a table)")
    tail.add_argument(
        "--skip-invalid",
        action="store_true",
        help="log and skip records that are not a ferret.v1.Prediction (default: stop with exit status 1)",
    )
    tail.set_defaults(handler=run_tail)


def run_tail(args: argparse.Namespace) -> int:
    from services.config import load_settings
    from services.predictions import iter_predictions

    kafka = load_settings(args.config).kafka
    security = {k: v for k, v in kafka.client_config().items() if k != "bootstrap.servers"}
    records = iter_predictions(
        args.bootstrap_servers or kafka.bootstrap_servers,
        args.topic_prefix or kafka.topic_prefix,
        from_beginning=args.from_beginning,
        follow=args.follow,
        group=args.group,
        max_records=args.max,
        timeout=args.timeout,
        idle_timeout=args.idle_timeout,
        skip_invalid=args.skip_invalid,
        config=security,
    )
    try:
        write(records, sys.stdout, as_json=args.json)
    finally:
        records.close()  # the consumer closes (and a group commits) even when stdout went away
    return 0


def write(records: Iterable[PredictionRecord], out: TextIO, *, as_json: bool) -> None:
    """Print each record as it comes (flushed, so a pipe sees it at once)."""
    if not as_json:
        print(TABLE_HEADER, file=out, flush=True)
    for record in records:
        line = strict_json.dumps(record.to_dict(), separators=(",", ":")) if as_json else table_row(record)
        print(line, file=out, flush=True)


def table_row(r: PredictionRecord) -> str:
    when = time.strftime("%H:%M:%S", time.gmtime(r.predicted_time_ms / 1000)) + f".{r.predicted_time_ms % 1000:03d}"
    label = "-" if r.label is None else str(r.label)
    ok = "-" if r.correct is None else ("y" if r.correct else "n")
    decision = r.decision + (" dup" if r.duplicate else "")
    top = " ".join(f"{p.class_index}:{p.probability:.2f}" for p in r.top_k)
    sample = r.sample_id if len(r.sample_id) <= 18 else "…" + r.sample_id[-17:]
    return (
        f"{when:<12}  {f'{r.partition}:{r.offset}':>11}  {r.item:>7}  {sample:<18}  {r.predicted_class:>4}  "
        f"{r.confidence:>5.2f}  {label:>5}  {ok:<2}  {decision:<14}  {r.online_accuracy:>6.2f}  "
        f"{r.latency_ms:>7.1f}  {top}"
    )
