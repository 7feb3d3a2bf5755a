"""``ferret profile``: time a model's units and write the profile JSON (DESIGN §4).

Example::

    ferret profile --model mnistnet --out benchmarks/profiles/mnistnet.json
    ferret profile --model resnet18 --input-size 224 --warmup 2 --repeats 5 --out resnet18-224.json
    ferret profile --model examples.custom_cnn:build --input-shape 1,28,28 --out custom_cnn.json
    ferret profile --model mnistnet --batch-sizes 1,10,20 --out mnistnet-batches.json   # mini-batch steps
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ferret_core.errors import ConfigError
from ferret_core.planning.profiler import CLOCKS, resolve_device
from ferret_core.profile import DTYPE_BYTES, LayerProfile, ModelProfile
from ferret_core.zoo import NORMS, ZooModel, build_model
from services import strict_json
from services.cli import profiling
from services.cli.args import non_negative_int, positive_int
from services.models import (
    MODEL_HELP,
    build_model_for,
    is_factory,
    model_spec_type,
    shape_type,
    zoo_shape_arguments,
)


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "profile",
        help="time a model's layers and write the profile JSON",
        description=(
            "Time every partitionable unit of a model, from the zoo or your own package.module:factory "
            "(median forward and backward time after warm-up), and count its parameters and activations; "
            "write the profile JSON that `ferret plan`, `ferret simulate` and `ferret run` read with "
            "--profile FILE, and print a table."
        ),
    )
    parser.add_argument("--model", required=True, type=model_spec_type, metavar="MODEL", help=MODEL_HELP)
    parser.add_argument(
        "--input-shape",
        type=shape_type,
        default=None,
        metavar="C,H,W",
        help="per-sample input shape, required for your own model (e.g. 1,28,28); zoo models: optional, "
        "instead of --input-size/--in-channels/--in-features (default: the zoo model's own)",
    )
    parser.add_argument("--out", required=True, type=Path, help="where to write the profile JSON")
    parser.add_argument(
        "--input-size",
        type=positive_int,
        default=None,
        help="square image side, e.g. 32 or 224 (default: the model's own: 28 mnistnet, 32 others)",
    )
    parser.add_argument("--num-classes", type=positive_int, default=10, help="output classes (default 10)")
    parser.add_argument(
        "--in-features", type=positive_int, default=None, help="mlp only: flat input size (default 784)"
    )
    parser.add_argument(
        "--in-channels",
        type=positive_int,
        default=None,
        help="image channels (default 1 mnistnet, 3 others)",
    )
    parser.add_argument(
        "--norm", choices=NORMS, default="group", help="normalisation of resnet18/mobilenet (default group)"
    )
    parser.add_argument(
        "--weights",
        type=Path,
        default=None,
        help="state-dict file to load, read with weights_only=True (default: none, fresh seeded weights)",
    )
    parser.add_argument("--seed", type=int, default=0, help="initialisation seed (default 0)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    parser.add_argument("--dtype", choices=sorted(DTYPE_BYTES), default="float32", help="default float32")
    parser.add_argument(
        "--warmup",
        type=non_negative_int,
        default=profiling.WARMUP,
        help=f"untimed runs per unit (default {profiling.WARMUP})",
    )
    parser.add_argument(
        "--repeats",
        type=positive_int,
        default=profiling.REPEATS,
        help=f"timed runs per unit (default {profiling.REPEATS})",
    )
    parser.add_argument("--batch-size", type=positive_int, default=1, help="items per step (default 1)")
    parser.add_argument(
        "--batch-sizes",
        type=batch_sizes_type,
        default=(),
        help="further mini-batch sizes to time, comma-separated (e.g. 1,10,20): the step times of "
        "random-n/last-n/camel and of replay micro-batches (default: none)",
    )
    parser.add_argument(
        "--clock",
        choices=CLOCKS,
        default=profiling.CLOCK,
        help="timer: auto (one CPU thread: thread CPU time, immune to other processes; several threads: "
        f"wall time; CUDA: events), wall, or cpu (default {profiling.CLOCK})",
    )
    parser.add_argument(
        "--threads",
        type=positive_int,
        default=profiling.THREADS,
        help=f"torch CPU threads while profiling (default {profiling.THREADS}, as the trainer runs)",
    )
    parser.add_argument("--json", action="store_true", help="print the profile JSON instead of the table")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    resolve_device(args.device)  # a clear ConfigError before building anything
    model = _build(args)
    progress = _Progress(enabled=not args.json and sys.stderr.isatty())
    profile = profiling.profile_now(
        model,
        device=args.device,
        dtype=args.dtype,
        threads=args.threads,
        warmup=args.warmup,
        repeats=args.repeats,
        batch_size=args.batch_size,
        batch_sizes=args.batch_sizes,
        clock=args.clock,
        progress=progress.update,
    )
    progress.close()
    out: Path = args.out
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        profile.save(out)
    except OSError as exc:
        raise ConfigError(f"cannot write the profile to {str(out)!r}: {exc}") from exc
    if args.json:
        print(strict_json.dumps(profile.to_dict(), indent=2))
    else:
        print(format_table(profile))
        print(f"wrote {out}")
    return 0


def _build(args: argparse.Namespace) -> ZooModel:
    """The model to profile: your own factory (needs --input-shape) or the zoo's."""
    if is_factory(args.model):
        if args.input_shape is None:
            raise ConfigError(f"--model {args.model} is your own factory: pass --input-shape (e.g. 1,28,28)")
        return build_model_for(
            args.model, input_shape=args.input_shape, num_classes=args.num_classes, seed=args.seed, weights=args.weights
        )
    shape: dict[str, int | None] = {
        "input_size": args.input_size,
        "in_channels": args.in_channels,
        "in_features": args.in_features,
    }
    if args.input_shape is not None:
        shape = {**zoo_shape_arguments(args.model, args.input_shape)}
    return build_model(
        args.model,
        num_classes=args.num_classes,
        input_size=shape.get("input_size"),
        in_channels=shape.get("in_channels"),
        in_features=shape.get("in_features"),
        norm=args.norm,
        seed=args.seed,
        weights=args.weights,
    )


def format_table(profile: ModelProfile) -> str:
    """A readable table of the profile: one row per unit, then the totals."""
    meta = profile.meta
    header = (
        f"{profile.model}  input {tuple(profile.input_shape)}  {profile.device} {profile.dtype}  "
        f"threads {meta.get('threads', '?')}  clock {meta.get('clock', '?')}  batch {meta.get('batch_size', '?')}  "
        f"median of {meta.get('repeats', '?')} after {meta.get('warmup', '?')} warm-up"
    )
    rows = [f"{'#':>3}  {'unit':<12}{'t_f ms':>10}{'t_b ms':>10}{'params':>12}{'activations':>13}{'saved':>10}"]
    for index, layer in enumerate(profile.layers):
        rows.append(_row(str(index), layer))
    total = LayerProfile(
        name="total",
        t_f=sum(layer.t_f for layer in profile.layers),
        t_b=sum(layer.t_b for layer in profile.layers),
        params=profile.total_params,
        activations=sum(layer.activations for layer in profile.layers),
        saved=sum(layer.saved or 0 for layer in profile.layers),
    )
    rule = "-" * len(rows[0])
    footer = [f"max t_f (the paper's t^d, --arrival-interval auto) = {profile.max_forward_time * 1e3:.3f} ms"]
    for batch in profile.batch_sizes:
        if batch != profile.base_batch:
            times = profile.layer_times(batch)
            t_f, t_b = sum(t for t, _ in times), sum(t for _, t in times)
            footer.append(f"batch {batch}: Σt_f {t_f * 1e3:.3f} ms, Σt_b {t_b * 1e3:.3f} ms")
    return "\n".join([header, rule, *rows, rule, _row("", total), *footer])


def _row(index: str, layer: LayerProfile) -> str:
    saved = "-" if layer.saved is None else str(layer.saved)
    return (
        f"{index:>3}  {layer.name:<12}{layer.t_f * 1e3:>10.3f}{layer.t_b * 1e3:>10.3f}"
        f"{layer.params:>12}{layer.activations:>13}{saved:>10}"
    )


class _Progress:
    """A progress line on stderr while profiling (only on a terminal)."""

    def __init__(self, *, enabled: bool) -> None:
        self.enabled = enabled

    def update(self, done: int, total: int) -> None:
        if self.enabled:
            print(f"\rprofiled {done}/{total} units", end="", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.enabled:
            print(file=sys.stderr)


def batch_sizes_type(text: str) -> tuple[int, ...]:
    """``"1,10,20"`` → ``(1, 10, 20)`` (sorted, distinct, each >= 1)."""
    try:
        sizes = tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError:
        sizes = ()
    if not sizes or sizes[0] < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 1 (e.g. 1,10,20), got {text!r}")
    return sizes


def _int_at_least(text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {text!r}")
    return value
