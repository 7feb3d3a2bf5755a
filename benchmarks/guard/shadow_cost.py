"""What the guard adds per item on the record path's thread, for a zoo model: the shadow's forward
(batch sizes 1, 16 and 256: the record path predicts one consumer batch together) and, as the obvious
alternative it is compared with, the live model's own prediction + one SGD step of the same batch size; and
the norm guard's two norms per update. Prints a Markdown table.

    flock /tmp/ferret-bench.lock .venv/bin/python -m benchmarks.guard.shadow_cost --model mnistnet
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

from ferret_core.engine.step_guard import step_scale
from services.config import load_settings
from services.trainer.guard.shadow import Shadow
from services.trainer.runner import build_zoo_model
from services.trainer.unit_weights import snapshot_tensors


def per_item_ms(fn: object, batch: int, repeats: int) -> float:
    call = fn  # type: ignore[assignment]
    call()  # warm-up
    began = time.perf_counter()
    for _ in range(repeats):
        call()  # type: ignore[operator]
    return 1e3 * (time.perf_counter() - began) / (repeats * batch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="mnistnet")
    parser.add_argument("--dataset", default="mnist")
    args = parser.parse_args()
    torch.set_num_threads(1)
    settings = load_settings(None, env={"FERRET_TRAINER_MODEL": args.model, "FERRET_TRAINER_DATASET": args.dataset})
    model = build_zoo_model(settings)
    state = {(u, n): t for u, unit in enumerate(model.units) for n, t in unit.state_dict().items()}
    shadow = Shadow(model, snapshot_tensors(state, 0))
    net = nn.Sequential(*model.units)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
    params = [p.detach() for p in net.parameters()]
    grads = [torch.randn_like(p) for p in params]
    print(f"| {args.model} | batch | shadow forward ms / item | live predict + SGD step ms / item | ratio |")
    print("|---|---|---|---|---|")
    for batch in (1, 16, 256):
        xs = torch.rand(batch, *model.input_shape)
        ys = torch.randint(model.num_classes, (batch,))
        repeats = max(3, 256 // batch)

        def step(xs: torch.Tensor = xs, ys: torch.Tensor = ys) -> None:
            with torch.no_grad():
                net(xs)
            optimizer.zero_grad()
            nn.functional.cross_entropy(net(xs), ys).backward()
            optimizer.step()

        shadow_ms = per_item_ms(lambda xs=xs: shadow.predict(xs), batch, repeats)
        live_ms = per_item_ms(step, batch, repeats)
        print(f"| | {batch} | {shadow_ms:.3f} | {live_ms:.3f} | {shadow_ms / live_ms:.2f} |")
    norms = per_item_ms(lambda: step_scale(params, grads, 0.01, 0.1), 1, 50)
    print(f"\nnorm guard: {norms:.3f} ms per update ({sum(p.numel() for p in params):,} weights)")


if __name__ == "__main__":
    main()
