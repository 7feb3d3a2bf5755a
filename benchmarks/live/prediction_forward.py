"""What one prediction forward costs the record path, with the zoo's max-pool (a channels-last copy
without gradients, :class:`ferret_core.zoo.base.MaxPool2d`) against torch's own ``nn.MaxPool2d`` on the
same weights, per zoo model and batch size; and the training step (forward + backward) both ways, which
the zoo leaves on torch's path. A trainer runs the prediction forward twice per item when its guard is on
(the live model and the shadow), the plain consumer once. Rounds alternate the two arms, each first in
every other round, so a drift of the machine falls on both; medians over the rounds. Prints a Markdown table.

    .venv/bin/python -m benchmarks.live.prediction_forward > benchmarks/live/results/prediction_forward.md
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

from ferret_core.zoo import build_model
from ferret_core.zoo.base import MaxPool2d


def with_torch_pool(net: nn.Module) -> nn.Module:
    """A copy of ``net`` whose zoo max-pools are torch's ``nn.MaxPool2d`` with the same geometry."""
    reference = copy.deepcopy(net)
    for module in reference.modules():
        for name, child in module.named_children():
            if isinstance(child, MaxPool2d):
                setattr(module, name, nn.MaxPool2d(child.kernel_size, child.stride, child.padding))
    return reference


def per_item_ms(call: Callable[[], object], batch: int, repeats: int) -> float:
    call()  # warm-up
    began = time.perf_counter()
    for _ in range(repeats):
        call()
    return 1e3 * (time.perf_counter() - began) / (repeats * batch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["mnistnet", "convnet"])
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 4, 16, 64])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)  # as the trainer (trainer.threads) and its executors
    print(f"torch {torch.__version__}, 1 thread; medians of {args.rounds} alternating rounds, ms per item\n")
    print(
        "| model | batch | forward, torch's pool | forward, zoo pool | ratio "
        "| train step, torch's | train step, zoo | ratio |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name in args.models:
        model = build_model(name, seed=0)
        zoo = model.as_sequential()
        arms = {"torch": with_torch_pool(zoo), "zoo": zoo}
        for batch in args.batches:
            xs = torch.rand(batch, *model.input_shape)
            ys = torch.randint(model.num_classes, (batch,))
            with torch.no_grad():
                assert torch.equal(arms["torch"](xs), arms["zoo"](xs))  # the same predictions, to the bit
            repeats = max(4, 128 // batch)
            forward: dict[str, list[float]] = {arm: [] for arm in arms}
            train: dict[str, list[float]] = {arm: [] for arm in arms}
            for r in range(args.rounds):
                order = list(arms.items()) if r % 2 == 0 else list(reversed(arms.items()))  # no arm always first
                for arm, net in order:

                    def predict(net: nn.Module = net, xs: torch.Tensor = xs) -> None:
                        with torch.no_grad():
                            net(xs)

                    def step(net: nn.Module = net, xs: torch.Tensor = xs, ys: torch.Tensor = ys) -> None:
                        net.zero_grad(set_to_none=True)
                        F.cross_entropy(net(xs), ys).backward()

                    forward[arm].append(per_item_ms(predict, batch, repeats))
                    train[arm].append(per_item_ms(step, batch, max(2, repeats // 2)))
            f = {arm: statistics.median(v) for arm, v in forward.items()}
            t = {arm: statistics.median(v) for arm, v in train.items()}
            print(
                f"| {name} | {batch} | {f['torch']:.3f} | {f['zoo']:.3f} | {f['zoo'] / f['torch']:.2f}× "
                f"| {t['torch']:.3f} | {t['zoo']:.3f} | {t['zoo'] / t['torch']:.2f}× |"
            )


if __name__ == "__main__":
    main()
