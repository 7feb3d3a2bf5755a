"""``ferret simulate``: run one method over a dataset stream on the virtual clock and report.

Examples::

    ferret simulate --dataset mnist --model mnistnet --method oracle --items 5000 \\
        --profile benchmarks/profiles/mnistnet.json --json
    ferret simulate --dataset mnist --model mnistnet --method ferret --budget 12MiB \\
        --profile benchmarks/profiles/mnistnet.json --trace trace.csv
    ferret simulate --dataset mnist --model mnistnet --method zb --budget 40MiB --flush-every 4 \\
        --profile benchmarks/profiles/mnistnet.json
    ferret simulate --dataset split-mnist --model mnistnet --method last-n --algorithm er --items 5000 \\
        --profile benchmarks/profiles/mnistnet-batches.json

Methods come from :data:`ferret_core.engine.METHODS`. Those that run on a planner's plan (Ferret, and the
pipeline schedules, which take Ferret's partition L* and worker slots) plan with the planning options
(``--budget``, ``--decay``, ...) for the OCL algorithm's step (its micro-batch's times and memory); the
buffering methods (Random-N, Last-N, Camel) fit their mini-batch N to ``--budget``. Only Ferret applies
``--compensator`` by default (iter-fisher-lean; ``--compensator iter-fisher`` is the paper's Algorithm 1); the
others apply none unless it is given.

    ferret plan --model mnistnet --profile benchmarks/profiles/mnistnet.json --in-flight schedule \
        --compensator none --budget 40MiB --json > plan.json
    ferret simulate --dataset mnist --model mnistnet --method ferret --plan plan.json \
        --profile benchmarks/profiles/mnistnet.json --compensator iter-fisher      # an ablation on a fixed plan

The stream is the dataset's training split in its stored order (for ``split-*`` with ``--items``: that
many items taken evenly from every task, so the stream keeps its tasks); every item is predicted by the
master at its arrival (online accuracy), test accuracy is measured on the test split at the end and, for
streams with tasks, per task at every task boundary (``task_accuracy``, with forgetting). ``--algorithm``
adds an OCL algorithm to any method; the methods that run a planner's plan plan for the algorithm's step
(its micro-batch's times and memory). Images are resized (bilinear) to the model's input when
``--input-size`` differs from the dataset's, and a profile taken at another input shape is refused, so
the plan and the run see the same shapes. Torch runs on ``--threads`` threads (default 1) with denormals
flushed, as the trainer does. With ``--profile`` the run is deterministic: the same seed gives the same
JSON except ``wall_seconds``. The planner counts items in flight from a replay of this virtual clock's
schedule (``--in-flight schedule``, the default here), which is exact for it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm  # type: ignore[import-untyped]

from ferret_core.compensation import CompensatorSettings
from ferret_core.data import (
    DATASET_NAMES,
    RESIZE_METHOD,
    Dataset,
    StreamItem,
    iter_stream,
    load_dataset,
    needs_resize,
    test_batches,
    test_split,
)
from ferret_core.data.stream import resize_images
from ferret_core.engine import (
    METHOD_NAMES,
    EngineSettings,
    MethodOptions,
    SimulationResult,
    StageTimes,
    StreamEngine,
    make_policy,
)
from ferret_core.engine.buffering import BUFFERING_METHODS, BufferingSettings
from ferret_core.engine.method_registry import method
from ferret_core.engine.staleness_calibration import CalibrationSettings
from ferret_core.engine.steps import Algorithm
from ferret_core.engine.trace import to_csv
from ferret_core.errors import ConfigError
from ferret_core.forgetting import TaskBoundaryAccuracy, task_tensor
from ferret_core.ocl import ALGORITHM_NAMES, AlgorithmSettings, make_algorithm
from ferret_core.plan import Plan
from ferret_core.planning.memory_model import MemorySettings
from ferret_core.profile import ModelProfile
from ferret_core.zoo import ZooModel, build_model
from services import strict_json
from services.cli.args import existing_file, non_negative_int, positive_float, positive_int
from services.cli.calibration import DEFAULT_CALIBRATION_ITEMS, calibrated_cost, stream_head
from services.cli.plan_cmd import (
    COMPENSATOR_CHOICES,
    PLANNER_COMPENSATOR,
    add_planning_arguments,
    add_replay_arguments,
    load_or_profile,
    model_from_profile,
    plan_for_algorithm,
)
from services.config.data_root import default_data_root
from services.config.sections import compensator_settings_from
from services.config.values import Invalid
from services.models import build_model_for, is_factory

MOMENTUM = 0.9  # --optimizer momentum
LAMBDA_SAMPLES = 10  # λ per stage sampled this many times along a run (``lambda_trace`` in --json)


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "simulate",
        help="run one training method (and an OCL algorithm) on a dataset stream (virtual clock)",
        description=(
            "Stream a dataset through the engine on the virtual clock (stage times from the profile, "
            "arrivals every t^d) with one method and OCL algorithm, and report online/test accuracy (per "
            "task at task boundaries for split-* streams), counts, skipped items, updates, measured and "
            "planned memory, staleness and the compensator's λ."
        ),
    )
    parser.add_argument("--dataset", required=True, choices=DATASET_NAMES, metavar="NAME", help="dataset")
    parser.add_argument(
        "--data-root", type=Path, default=None, help="data folder (default ../shared/data, else ~/.cache/ferret/data)"
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="keep decoded images (CIFAR-10 JPEG, image folders) here as .npz, so the next run skips the decode "
        "(default: none, decode every run)",
    )
    parser.add_argument("--method", required=True, choices=METHOD_NAMES, help="training method")
    parser.add_argument(
        "--algorithm", choices=ALGORITHM_NAMES, default="vanilla", help="OCL algorithm (default vanilla)"
    )
    parser.add_argument(
        "--flush-every",
        type=positive_int,
        default=None,
        metavar="M",
        help="micro-batches per pipeline between updates: the flush group of dapple, zb and hanayo-*, the "
        "accumulation of pipedream-2bw (default: the number of stages P)",
    )
    parser.add_argument(
        "--wait-slots",
        type=non_negative_int,
        default=1,
        help="items that may wait for stage 0 per worker (Ferret and the pipeline schedules; default 1)",
    )
    add_planning_arguments(parser)
    add_algorithm_arguments(parser)
    parser.add_argument("--items", type=non_negative_int, default=None, help="stream length (default: all)")
    parser.add_argument("--seed", type=int, default=0, help="model initialisation and dataset seed (default 0)")
    parser.add_argument("--lr", type=positive_float, default=1e-3, help="SGD learning rate (default 1e-3)")
    parser.add_argument(
        "--plan",
        type=existing_file,
        default=None,
        help="execute this plan (the JSON of `ferret plan --json`) instead of planning: e.g. a plan made with "
        "--compensator none, run with each compensator (an ablation that fixes the pipeline; default: plan now)",
    )
    parser.add_argument(
        "--threads", type=positive_int, default=1, help="torch threads (default 1; more fight other processes)"
    )
    parser.add_argument(
        "--test-items",
        type=positive_int,
        default=None,
        help="test accuracy on this many test items, evenly spaced over the test split (default: all)",
    )
    parser.add_argument(
        "--trace", type=Path, default=None, help="write the executed trace as CSV to this file (default: none)"
    )
    parser.add_argument(
        "--calibration-items",
        type=positive_int,
        default=DEFAULT_CALIBRATION_ITEMS,
        help="--objective accuracy: calibrate the cost of staleness on this many items of the stream's head "
        f"(default {DEFAULT_CALIBRATION_ITEMS}; cached under --cache-dir)",
    )
    parser.add_argument(
        "--calibration-compensator",
        choices=COMPENSATOR_CHOICES,
        default="none",
        help="--objective accuracy: the compensator the staleness calibration runs apply (default none: the cost "
        "of uncompensated staleness; the run's own compensator measures what staleness costs once compensated)",
    )
    parser.add_argument(
        "--compensator-setting",
        action="append",
        type=name_equals_value,
        default=[],
        metavar="NAME=VALUE",
        help="a compensator hyper-parameter other than its default, for the run's compensator (repeatable; the "
        "fields of CompensatorSettings, as trainer.compensator_settings: e.g. dc_lambda0=20, dc_bound=inf)",
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.set_defaults(handler=run)


def name_equals_value(text: str) -> tuple[str, str]:
    """``NAME=VALUE`` as (NAME, VALUE)."""
    name, sep, value = text.partition("=")
    if not sep or not name.strip() or not value.strip():
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE (e.g. dc_lambda0=20), got {text!r}")
    return name.strip(), value.strip()


def compensator_settings_of(args: argparse.Namespace) -> CompensatorSettings:
    """The run's compensator settings: the defaults, changed by ``--compensator-setting``."""
    try:
        return compensator_settings_from(dict(args.compensator_setting))
    except Invalid as exc:
        fix = f"; {exc.fix}" if exc.fix else ""
        raise ConfigError(
            f"--compensator-setting {exc.subkey or ''}: expected {exc.expected}, got {exc.got!r}{fix}"
        ) from None


def add_algorithm_arguments(parser: argparse.ArgumentParser) -> None:
    """The buffering methods' and OCL algorithms' options (defaults: docs/ocl.md)."""
    group = parser.add_argument_group("buffering methods (random-n, last-n, camel)")
    defaults = BufferingSettings()
    group.add_argument("--bskip-batch", type=positive_int, default=defaults.batch,
                       help=f"N: items per mini-batch step (default {defaults.batch}; with --budget: the largest N "
                       "that fits, up to this)")
    group.add_argument("--bskip-window", type=positive_int, default=defaults.window,
                       help=f"B: newest unprocessed items kept (default {defaults.window})")
    group.add_argument("--camel-buffer", type=positive_int, default=defaults.camel_buffer,
                       help=f"Camel's buffer of representative samples (default {defaults.camel_buffer})")
    group.add_argument("--camel-replay", type=non_negative_int, default=None,
                       help="items Camel replays per step (default: N)")
    ocl = parser.add_argument_group("OCL algorithms (er, mir, lwf, mas)")
    a = AlgorithmSettings()
    add_replay_arguments(ocl)
    ocl.add_argument("--lwf-every", type=positive_int, default=a.lwf_every,
                     help=f"LwF teacher refresh period in trained items (default {a.lwf_every})")
    ocl.add_argument("--mas-every", type=positive_int, default=a.mas_every,
                     help=f"MAS importance refresh period in trained items (default {a.mas_every})")
    ocl.add_argument("--mas-lambda", type=positive_float, default=a.mas_lambda,
                     help=f"MAS penalty strength λ (default {a.mas_lambda:g})")


def algorithm_settings(args: argparse.Namespace) -> AlgorithmSettings:
    return AlgorithmSettings(
        buffer_size=args.replay_buffer,
        replay_batch=args.replay_batch,
        mir_candidates=args.mir_candidates,
        lwf_every=args.lwf_every,
        mas_every=args.mas_every,
        mas_lambda=args.mas_lambda,
        seed=args.seed,
    )


def buffering_settings(args: argparse.Namespace) -> BufferingSettings:
    return BufferingSettings(
        batch=args.bskip_batch,
        window=max(args.bskip_window, args.bskip_batch),
        camel_buffer=args.camel_buffer,
        camel_replay=args.camel_replay,
        seed=args.seed,
    )


def step_batch_sizes(args: argparse.Namespace, algorithm: Algorithm) -> tuple[int, ...]:
    """The mini-batch sizes the run's steps take once buffers are full (1, the admitted samples, the
    step with its replayed samples, MIR's retrieval passes): what ``simulate`` profiles when it profiles
    the model now; steps in between are interpolated (:meth:`ModelProfile.layer_times`)."""
    new = buffering_settings(args).step_batch(args.method) if args.method in BUFFERING_METHODS else 1
    shape = algorithm.steady_shape(new)
    return tuple(sorted({1, new, shape.batch, *(batch for batch, _ in shape.overhead)}))


def ferret_plan(args: argparse.Namespace, profile: ModelProfile, algorithm: Algorithm) -> Plan:
    """The planner's plan (Ferret's, which the pipeline schedules run on too) for the algorithm's usual
    step (:func:`~services.cli.plan_cmd.plan_for_algorithm`, what ``ferret plan --algorithm`` runs), with
    items in flight replayed on this virtual clock's schedule unless ``--in-flight`` says otherwise."""
    return plan_for_algorithm(args, profile, algorithm, in_flight="schedule")


def run(args: argparse.Namespace) -> int:
    model_from_profile(args)
    if args.model is None:
        raise ConfigError("simulate needs --model (a zoo name or package.module:factory) or --profile FILE")
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)  # a repeated sample drove MNISTNet from 3 to 28 ms per step (DESIGN §5)
    root = args.data_root if args.data_root is not None else default_data_root()
    loaded = load_dataset(args.dataset, root, seed=args.seed, cache_dir=args.cache_dir)
    dataset = fewer_test_items(loaded, args.test_items)
    model = _model(args, dataset)
    args.num_classes = dataset.num_classes
    algorithm = make_algorithm(args.algorithm, algorithm_settings(args))
    profile = _profile(args, model, step_batch_sizes(args, algorithm))
    if profile.num_units != model.num_units:
        raise ConfigError(
            f"profile {args.profile} has {profile.num_units} units, {model.name} on {dataset.name} has "
            f"{model.num_units}; profile this model (ferret profile) or omit --profile"
        )
    if args.method == "camel" and args.algorithm != "vanilla":
        raise ConfigError(
            "camel brings its own anti-forgetting buffer and is not combined with an OCL algorithm (as in the "
            "paper); use --algorithm vanilla with camel, or another method"
        )
    cost_file = _calibrate(args, dataset, model)
    plan = _plan(args, model, profile, algorithm)
    arrival = plan.arrival_interval if plan is not None else args.arrival_interval.resolve(profile.max_forward_time)
    result, tasks = simulate_dataset(args, model, dataset, profile, arrival, plan, algorithm)
    if args.trace is not None and result.trace is not None:
        args.trace.write_text(to_csv(result.trace))
    report = _report(args, result, arrival, plan, dataset, model)
    cost = getattr(args, "calibrated_cost", None)
    report["staleness_cost"] = None if cost is None else cost.to_dict()
    report["staleness_cost_file"] = None if cost_file is None else str(cost_file)
    report["task_accuracy"] = None if tasks is None else tasks.to_dict()
    report["compensator_settings"] = dict(args.compensator_setting)  # the non-defaults, as given ("inf")
    if args.json:
        print(strict_json.dumps(report, indent=2))
    else:
        print(format_report(report))
    if any(m > b for m, b in zip(result.max_staleness, result.staleness_bound, strict=True)):
        print(
            f"ferret: warning: staleness {list(result.max_staleness)} exceeded the schedule's bound "
            f"{list(result.staleness_bound)} (ferret_core.staleness); the Iter-Fisher ring was sized to the bound",
            file=sys.stderr,
        )
    return 0


def _calibrate(args: argparse.Namespace, dataset: Dataset, model: ZooModel) -> Path | None:
    """Under ``--objective accuracy`` without ``--staleness-cost``, for a method that plans now: measure
    the cost of staleness on the stream's head (:mod:`services.cli.calibration`, cached under
    ``--cache-dir``) into ``args.calibrated_cost``; returns the cache file (``None``: not cached or not
    calibrated)."""
    if args.objective != "accuracy" or args.staleness_cost is not None:
        return None
    if not method(args.method).needs_plan or args.plan is not None:
        return None
    head = stream_head(args, dataset, model.input_shape, args.calibration_items)

    def build_units(seed: int) -> Sequence[torch.nn.Module]:
        return _model(argparse.Namespace(**{**vars(args), "seed": seed}), dataset).units

    settings = CalibrationSettings(lr=args.lr, compensator=args.calibration_compensator)
    source = f"{args.dataset} head of {len(head)} items, {model.name}, lr {args.lr:g}, seeds {list(settings.seeds)}"
    if settings.compensator != "none":
        source += f", compensator {settings.compensator}"
    cost, path = calibrated_cost(
        model=model.name, build_units=build_units, head=head, settings=settings, source=source,
        cache_dir=args.cache_dir,
    )
    args.calibrated_cost = cost
    return path


def _profile(args: argparse.Namespace, model: ZooModel, batch_sizes: Sequence[int] = ()) -> ModelProfile:
    """``--profile`` (refused when taken at another input shape), else a profile of the model run here
    on ``--threads`` threads, as ``ferret profile`` takes it (:func:`services.cli.profiling.profile_now`),
    with step times for the mini-batch ``batch_sizes`` too (:func:`step_batch_sizes`)."""
    if args.profile is not None:
        return load_or_profile(args, model.input_shape)
    from services.cli.profiling import profile_now

    return profile_now(model, device=args.device, dtype=args.dtype, threads=args.threads, batch_sizes=batch_sizes)


def _plan(args: argparse.Namespace, model: ZooModel, profile: ModelProfile, algorithm: Algorithm) -> Plan | None:
    if not method(args.method).needs_plan:
        if args.plan is not None:
            raise ConfigError(
                f"--plan is executed by the methods that run a planner's plan ({', '.join(_planned_methods())}), "
                f"not {args.method!r}; drop --plan or pick one of those"
            )
        return None
    if args.plan is None:
        return ferret_plan(args, profile, algorithm)
    try:
        plan = Plan.from_dict(json.loads(args.plan.read_text()))
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"--plan {str(args.plan)!r} is not the JSON of `ferret plan --json`: {exc}") from None
    if plan.model != model.name or plan.partition.num_units != model.num_units:
        raise ConfigError(
            f"--plan {str(args.plan)!r} is for {plan.model!r} with {plan.partition.num_units} units, this run is "
            f"{model.name!r} with {model.num_units}; plan this model (ferret plan --model {model.name} --json)"
        )
    return plan


def _planned_methods() -> list[str]:
    return [name for name in METHOD_NAMES if method(name).needs_plan]


def simulate_dataset(
    args: argparse.Namespace,
    model: ZooModel,
    dataset: Dataset,
    profile: ModelProfile,
    arrival: float,
    plan: Plan | None,
    algorithm: Algorithm | None = None,
) -> tuple[SimulationResult, TaskBoundaryAccuracy | None]:
    """The run's result, and the per-task test accuracy at task boundaries for streams with tasks."""
    if args.optimizer == "adam":
        raise ConfigError("the engine implements SGD and SGD with momentum; use --optimizer sgd or momentum")
    compensator = run_compensator(args)
    buffering = args.method in BUFFERING_METHODS
    footprint = (algorithm if algorithm is not None else make_algorithm("vanilla")).footprint
    options = MethodOptions(
        wait_slots=args.wait_slots,
        flush_every=args.flush_every,
        memory=MemorySettings(
            variant="engine", dtype=args.dtype, optimizer=args.optimizer, compensator=compensator
        ),
        buffering=buffering_settings(args) if buffering else BufferingSettings(),
        budget=args.budget if buffering else None,
        footprint=footprint,
    )
    policy = make_policy(args.method, plan, profile=profile, options=options)
    setup = policy.setup(model.name, model.num_units, arrival)
    settings = EngineSettings(
        lr=args.lr,
        momentum=MOMENTUM if args.optimizer == "momentum" else 0.0,
        compensator=compensator,
        compensator_settings=compensator_settings_of(args),
        keep_trace=True,
    )
    engine = StreamEngine(model.units, setup, settings, algorithm=algorithm)
    total = len(dataset.y_train) if args.items is None else min(args.items, len(dataset.y_train))
    resize = needs_resize(dataset, model.input_shape)
    size = (int(model.input_shape[1]), int(model.input_shape[2])) if resize else (0, 0)

    def evaluate(x: torch.Tensor, y: torch.Tensor) -> float:  # a task's held-out items, resized like the stream
        if not resize:
            return engine.evaluate(x, y)
        correct = 0.0
        for start in range(0, len(y), 100):
            part = slice(start, start + 100)
            correct += engine.evaluate(resize_images(x[part], size), y[part]) * len(y[part])
        return correct / len(y)

    tasks = None
    if dataset.num_tasks > 1 and dataset.tasks_test is not None:
        test_x, test_y = test_split(dataset)  # TaskBoundaryAccuracy keeps only its first items per task
        tasks = TaskBoundaryAccuracy(test_x, test_y, task_tensor(dataset.tasks_test), evaluate)
        del test_x, test_y
    stream_tasks: list[int] = []

    def stream() -> Iterator[StreamItem]:
        for item in iter_stream(dataset, limit=total, seed=args.seed, input_shape=model.input_shape, per_task=True):
            stream_tasks.append(item.task)
            yield item

    lambdas: list[tuple[int, tuple[float | None, ...]]] = []
    every = max(1, -(-total // LAMBDA_SAMPLES))

    def on_arrival(index: int) -> None:
        if tasks is not None:  # at a new task's first arrival, before it is trained on
            tasks.observe(stream_tasks[index])
        if index % every == 0:  # λ per stage before this arrival (a device sync: LAMBDA_SAMPLES per run)
            lambdas.append((index, tuple(s["lambda"] for s in engine.compensator_stats())))
        bar.update(1)

    times = StageTimes.from_profile(profile, setup.plan.partition)
    with tqdm(total=total, desc=f"{args.method} on {dataset.name}", unit="item", file=sys.stderr) as bar:
        result = engine.run_virtual(stream(), times, arrival, on_arrival=on_arrival)
    if tasks is not None:
        tasks.finish()
    correct = seen = 0.0
    for x, y in test_batches(dataset, model.input_shape):
        correct += engine.evaluate(x, y) * len(y)
        seen += len(y)
    lambdas.append((result.items, result.lambdas))
    return dataclasses.replace(result, tacc=correct / seen if seen else None, lambda_trace=tuple(lambdas)), tasks


def run_compensator(args: argparse.Namespace) -> str:
    """The compensator the run applies: ``--compensator`` when given, else iter-fisher-lean for the methods
    that compensate by default (Ferret) and none for the others (never stale, or compared without
    compensation as in the paper's pipeline table)."""
    if args.compensator is not None:
        return str(args.compensator)
    return PLANNER_COMPENSATOR if method(args.method).compensates else "none"


def fewer_test_items(dataset: Dataset, count: int | None) -> Dataset:
    """``dataset`` with at most ``count`` test items taken at an even stride over its test split (all of them
    for ``None``): every class (and task) of a split stored class by class is still represented. The stride
    is rounded up, so fewer may be kept (300 of MNIST's 10,000 keeps 295); the bench's committed tables were
    made with this rule."""
    if count is None or count >= len(dataset.y_test):
        return dataset
    step = max(1, math.ceil(len(dataset.y_test) / count))
    kept = slice(None, step * count, step)
    tasks = None if dataset.tasks_test is None else dataset.tasks_test[kept]
    return dataclasses.replace(dataset, x_test=dataset.x_test[kept], y_test=dataset.y_test[kept], tasks_test=tasks)


def _model(args: argparse.Namespace, dataset: Dataset) -> ZooModel:
    shape = dataset.input_shape
    if is_factory(args.model):  # your own model: the dataset gives its input shape and classes
        return build_model_for(args.model, input_shape=shape, num_classes=dataset.num_classes, seed=args.seed)
    if args.model == "mlp":
        return build_model("mlp", num_classes=dataset.num_classes, in_features=math.prod(shape), seed=args.seed)
    if len(shape) != 3:
        raise ConfigError(f"{args.model} takes images; {dataset.name} has samples of shape {shape}; use --model mlp")
    return build_model(
        args.model,
        num_classes=dataset.num_classes,
        in_channels=shape[0],
        input_size=shape[-1] if args.input_size is None else args.input_size,
        seed=args.seed,
    )


def _report(
    args: argparse.Namespace,
    result: SimulationResult,
    arrival: float,
    plan: Plan | None,
    dataset: Dataset,
    model: ZooModel,
) -> dict[str, Any]:
    resized = needs_resize(dataset, model.input_shape)
    out: dict[str, Any] = {
        "dataset": args.dataset,
        "model": args.model,
        "seed": args.seed,
        "lr": args.lr,
        "arrival_interval": arrival,
        "profile": None if args.profile is None else str(args.profile),
        "flush_every": args.flush_every,
        "wait_slots": args.wait_slots,
        "plan_file": None if args.plan is None else str(args.plan),
        "threads": torch.get_num_threads(),
        "input": {
            "dataset_shape": list(dataset.input_shape),
            "model_shape": list(model.input_shape),
            "resize": RESIZE_METHOD if resized else None,
        },
    }
    out.update(result.to_dict())
    out["plan"] = None if plan is None else plan.to_dict()
    return out


def format_report(report: dict[str, Any]) -> str:
    """A readable summary of :func:`_report`'s values."""

    def fmt(values: list[Any]) -> str:
        return "[" + ", ".join("null" if v is None else f"{v:.4g}" for v in values) + "]"

    skipped = ", ".join(f"{k} {v}" for k, v in report["skipped"].items() if v) or "none"
    lines = [
        f"{report['method']} + {report['algorithm']} on {report['dataset']} / {report['model']} "
        f"({report['items']} items, t^d = {report['arrival_interval'] * 1e3:.4g} ms, compensator "
        f"{report['compensator']}, seed {report['seed']})",
        f"  online accuracy  {report['oacc']:.2f} %",
        f"  test accuracy    {'n/a' if report['tacc'] is None else format(report['tacc'], '.2f') + ' %'}",
        f"  input            {_input_line(report['input'])}",
        f"  trained          {report['trained']} through every stage, {report['trained_any_stage']} through any",
        f"  skipped          {skipped}",
        f"  updates/stage    {report['updates_per_stage']}",
        f"  memory           measured peak {_bytes(report['peak_bytes'])}, planned {_bytes(report['planned_bytes'])}",
        f"  staleness        mean {fmt(report['mean_staleness'])}, max {report['max_staleness']}, "
        f"bound {report['staleness_bound']}",
        f"  λ                {fmt(report['lambda'])}",
        f"  rel. correction  {fmt(report['relative_correction'])}",
        f"  staleness hist.  {report.get('staleness_histogram', [])}",
        f"  wall time        {report['wall_seconds']:.2f} s",
    ]
    tasks = report.get("task_accuracy")
    if tasks:
        for task, row in zip(tasks["after_task"], tasks["accuracy"], strict=True):
            lines.append(f"  after task {task:<5} test accuracy by task {fmt(row)}")
        forgetting = tasks["forgetting"]
        lines.append(f"  forgetting       {'n/a' if forgetting is None else format(forgetting, '.2f') + ' points'}")
    return "\n".join(lines)


def _input_line(info: dict[str, Any]) -> str:
    model = "×".join(map(str, info["model_shape"]))
    if info["resize"] is None:
        return model
    return f"{'×'.join(map(str, info['dataset_shape']))} resized to {model} ({info['resize']})"


def _bytes(value: int | None) -> str:
    return "n/a" if value is None else f"{value:,} B ({value / 2**20:.2f} MiB)"
