"""``ferret produce``: stream a dataset into ``<prefix>.samples`` (DESIGN §4).

Examples::

    ferret produce --dataset mnist --bootstrap-servers 127.0.0.1:9092 --rate 500 --items 10000
    ferret produce --dataset digits --loop --labels delayed --label-delay-s 2 --partitions 3
    ferret produce --config ferret.yaml --rate max          # FERRET_* variables apply too

Flags override the ``producer`` and ``kafka`` sections of the config (``--config`` or ``$FERRET_CONFIG``
plus ``FERRET_*`` variables). Prints a progress bar on stderr and the final counts on stdout. Exit
status 0 when every record was delivered (also after a clean stop by SIGINT/SIGTERM), 1 with a one-line
reason when any delivery failed.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

from tqdm import tqdm  # type: ignore[import-untyped]

from ferret_core.data import DATASET_NAMES, load_dataset
from services.cli.args import non_negative_float, non_negative_int, positive_int, rate_type
from services.cli.logs import add_logging_arguments, configure_logging
from services.config import Settings, load_settings
from services.config.data_root import default_data_root
from services.producer import SampleProducer

EXIT_OK = 0
EXIT_FAILURE = 1
log = logging.getLogger("ferret.producer")


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "produce",
        help="stream a dataset into the samples topic",
        description=(
            "Stream a dataset's items as ferret.v1.Sample records into <prefix>.samples (key = sample id "
            "<stream>/<sequence>) at a paced rate, with labels in the sample, delayed on <prefix>.labels, "
            "or none. Unset flags take the config's producer/kafka values."
        ),
    )
    parser.add_argument("--config", type=Path, default=None, help="YAML settings file (default: $FERRET_CONFIG)")
    parser.add_argument(
        "--dataset", choices=DATASET_NAMES, default=None, metavar="NAME", help="dataset to stream (default mnist)"
    )
    parser.add_argument("--data-root", type=Path, default=None, help="data folder (default ../shared/data or cache)")
    parser.add_argument(
        "--split", choices=("train", "test"), default=None, help="which split to stream (default train)"
    )
    parser.add_argument("--stream", default=None, help="stream name used in sample ids (default: the dataset)")
    parser.add_argument(
        "--bootstrap-servers",
        default=None,
        metavar="HOST:PORT",
        help="Kafka bootstrap servers (default: kafka.bootstrap_servers, 127.0.0.1:9092)",
    )
    parser.add_argument("--topic-prefix", default=None, help="topic prefix (default ferret)")
    parser.add_argument(
        "--partitions",
        type=positive_int,
        default=None,
        metavar="K",
        help="partitions of created topics (default: kafka.sample_partitions, 1)",
    )
    parser.add_argument(
        "--rate", type=rate_type, default=None, metavar="ITEMS_PER_S", help="items per second, or 'max' (default max)"
    )
    parser.add_argument(
        "--burst", type=positive_int, default=None, metavar="N", help="items sent back to back (default 1)"
    )
    amount = parser.add_mutually_exclusive_group()
    amount.add_argument(
        "--items",
        type=non_negative_int,
        default=None,
        metavar="N",
        help="items to send, cycling the split (default: the split once)",
    )
    amount.add_argument("--loop", action="store_true", default=None, help="cycle the split until stopped")
    parser.add_argument(
        "--labels",
        choices=("with-sample", "delayed", "none"),
        default=None,
        help="where labels go (default with-sample)",
    )
    parser.add_argument(
        "--label-delay-s", type=non_negative_float, default=None, metavar="S", help="label delay in seconds (default 1)"
    )
    parser.add_argument("--seed", type=int, default=None, help="dataset loading / shuffling seed (default 0)")
    parser.add_argument("--shuffle", action="store_true", default=None, help="stream the split in a seeded order")
    parser.add_argument("--no-create-topics", action="store_true", help="do not create missing topics")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    add_logging_arguments(parser, level="WARNING")
    parser.set_defaults(handler=run)


def settings_from_args(args: argparse.Namespace) -> Settings:
    """The config with the flags that were given applied (validated again)."""
    settings = load_settings(args.config)
    kafka_flags = {
        "bootstrap_servers": args.bootstrap_servers,
        "topic_prefix": args.topic_prefix,
        "sample_partitions": args.partitions,
    }
    producer_flags = {
        "dataset": args.dataset,
        "data_root": args.data_root,
        "split": args.split,
        "stream": args.stream,
        "burst": args.burst,
        "labels": args.labels,
        "label_delay_s": args.label_delay_s,
        "seed": args.seed,
        "shuffle": args.shuffle,
    }
    given = {k: v for k, v in producer_flags.items() if v is not None}
    if args.rate is not None:  # "max" parses to math.inf: no pacing
        given["rate"] = None if math.isinf(args.rate) else args.rate
    if args.items is not None:
        given.update(items=args.items, loop=False)
    elif args.loop:
        given.update(items=None, loop=True)
    kafka = dataclasses.replace(settings.kafka, **{k: v for k, v in kafka_flags.items() if v is not None})
    producer = dataclasses.replace(settings.producer, **given)
    return dataclasses.replace(settings, kafka=kafka, producer=producer)


def run(args: argparse.Namespace) -> int:
    configure_logging(args.log_level, args.log_format)
    settings = settings_from_args(args)
    options = settings.producer
    root = options.data_root or default_data_root()
    dataset = load_dataset(options.dataset, root, seed=options.seed)
    producer = SampleProducer(dataset, settings.kafka, options, create_topics=not args.no_create_topics)
    stream = producer.stream
    total = producer.total
    rate = "max" if options.rate is None else f"{options.rate:g}/s"
    json_logs = args.log_format == "json"
    with _stop_on_signals(producer):
        started = (  # after the handlers are installed: a SIGTERM from here on stops cleanly
            f"producing {stream} ({'until stopped' if total is None else f'{total} items'}, "
            f"{'x'.join(map(str, dataset.input_shape))} {dataset.x_train.dtype}) to {producer.topics.samples} "
            f"at {settings.kafka.bootstrap_servers}, rate {rate}, labels {options.labels}"
        )
        if json_logs:
            log.info(started)
        else:
            print(started, file=sys.stderr, flush=True)
        quiet = args.quiet or json_logs  # a progress bar would break the JSON lines on stderr
        with tqdm(total=total, unit="item", file=sys.stderr, disable=quiet, mininterval=0.25) as bar:
            producer.progress = bar
            report = producer.run()
    print(report.summary(), flush=True)
    reason = report.failure_reason()
    if reason is not None:
        if json_logs:
            log.error(reason)
        else:
            print(f"ferret: error: {reason}", file=sys.stderr)
        return EXIT_FAILURE
    return EXIT_OK


@contextmanager
def _stop_on_signals(producer: SampleProducer) -> Iterator[None]:
    """SIGINT and SIGTERM ask the producer to stop cleanly (flush, final counts) while it runs."""

    def handler(signum: int, frame: FrameType | None) -> None:
        # From another thread: setting the Event here could block on its lock if the signal arrived
        # while this (the main) thread held it inside Event.wait.
        threading.Thread(target=producer.stop, name="ferret-produce-stop").start()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
