"""``ferret run``: the trainer service."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
from pathlib import Path

from ferret_core.engine import METHOD_NAMES, METHODS
from ferret_core.errors import ConfigError
from services.cli.args import budget_type, positive_int
from services.cli.logs import add_logging_arguments, configure_logging
from services.config import load_settings
from services.models import MODEL_HELP, model_spec_type, shape_type
from services.supervisor import RESTARTS_ENV, Supervisor

log = logging.getLogger("ferret.trainer")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "run",
        help="run the trainer: Kafka samples → predictions, a method's pipeline (Ferret's plan), gRPC control",
        description=(
            "Consume <prefix>.samples, predict every item on arrival, train with --method (Ferret's planned "
            "pipeline by default) and publish one prediction per item to <prefix>.predictions. Settings come "
            "from --config (YAML) and FERRET_* variables; the flags below override them. Stops cleanly on "
            "SIGTERM/SIGINT."
        ),
    )
    parser.add_argument("--config", type=Path, default=None, help="YAML settings file (default $FERRET_CONFIG)")
    parser.add_argument(
        "--bootstrap-servers",
        default=None,
        metavar="HOST:PORT",
        help="Kafka bootstrap servers (default: kafka.bootstrap_servers, 127.0.0.1:9092)",
    )
    parser.add_argument(
        "--redis-url", default=None, metavar="URL", help="snapshot store (default: redis.url, redis://127.0.0.1:6379/0)"
    )
    parser.add_argument(
        "--topic-prefix", default=None, help="topics <prefix>.samples, .predictions, ... (default: kafka.topic_prefix)"
    )
    parser.add_argument(
        "--dataset",
        default=None,
        metavar="NAME",
        help="what the stream carries: its input shape and classes (default: trainer.dataset, mnist)",
    )
    parser.add_argument(
        "--model", type=model_spec_type, default=None, metavar="MODEL", help=f"{MODEL_HELP} (default: trainer.model)"
    )
    parser.add_argument(
        "--input-shape",
        type=shape_type,
        default=None,
        metavar="C,H,W",
        help="per-sample input shape of your own stream (default: trainer.input_shape, else the dataset's)",
    )
    parser.add_argument(
        "--num-classes",
        type=positive_int,
        default=None,
        help="classes of your own stream (default: trainer.num_classes, else the dataset's)",
    )
    parser.add_argument(
        "--weights",
        type=Path,
        default=None,
        help="state-dict file loaded at start with weights_only=True (default: trainer.weights, none)",
    )
    parser.add_argument(
        "--method",
        default=None,
        choices=METHOD_NAMES,
        help="training method (default: trainer.method, ferret); those that do not plan for a budget: "
        + ", ".join(m for m in METHOD_NAMES if not METHODS[m].needs_plan),
    )
    parser.add_argument(
        "--budget",
        type=budget_type,
        default=None,
        help="memory budget: bytes or 512MiB (default: trainer.budget_bytes, unconstrained)",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="profile JSON of the model (default: trainer.profile, else profile at start-up)",
    )
    parser.add_argument(
        "--listen",
        default=None,
        metavar="HOST:PORT",
        help="gRPC control address (default: control.listen, 127.0.0.1:50051)",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="Prometheus port, 0 for a free one (default: metrics.port, 9100)",
    )
    parser.add_argument(
        "--supervise",
        action="store_true",
        help="run the trainer as a child process and restart it with backoff when it exits with a failure "
        "(it resumes from its last snapshot and committed offsets; services/supervisor.py)",
    )
    add_logging_arguments(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    configure_logging(args.log_level, args.log_format)
    settings = load_settings(args.config)  # a bad setting fails here, before any child starts
    if settings.trainer.hosts == "torchrun":
        if args.supervise:
            raise ConfigError(
                "--supervise with trainer.hosts: torchrun: a restarted trainer cannot rejoin its job; let torchrun "
                "restart the whole job instead (torchrun --max-restarts N), or set trainer.hosts: off"
            )
        from services.hosts.job import join, serve  # torch.distributed: only under torchrun

        if join() != 0:  # rank 0 is the trainer; every other rank serves its stages until it ends the job
            return serve(settings.control.health_listen)
    if args.supervise:
        return supervise([a for a in args.argv if a != "--supervise"])
    restarts = int(os.environ.get(RESTARTS_ENV, "0") or 0)
    if restarts:
        log.warning("started again by its supervisor: restart #%d", restarts)
    overrides = {
        "kafka": {"bootstrap_servers": args.bootstrap_servers, "topic_prefix": args.topic_prefix},
        "redis": {"url": args.redis_url},
        "trainer": {
            "dataset": args.dataset,
            "model": args.model,
            "input_shape": args.input_shape,
            "num_classes": args.num_classes,
            "weights": args.weights,
            "method": args.method,
            "budget_bytes": args.budget,
            "profile": args.profile,
        },
        "control": {"listen": args.listen},
        "metrics": {"port": args.metrics_port},
    }
    for section, values in overrides.items():
        given = {k: v for k, v in values.items() if v is not None}
        if given:
            settings = dataclasses.replace(
                settings, **{section: dataclasses.replace(getattr(settings, section), **given)}
            )
    from services.trainer.runner import run_trainer

    return run_trainer(settings)


def supervise(argv: list[str]) -> int:
    """``ferret run`` (``argv`` without ``--supervise``) as a supervised child (services/supervisor.py)."""
    supervisor = Supervisor([sys.executable, "-m", "services.cli.main", *argv])
    supervisor.forward_signals()
    code = supervisor.run()
    log.info("supervisor: the trainer exited with code %d after %d restart(s)", code, supervisor.restarts)
    return code
