"""What the guard adds per item on the record path's thread, for a zoo model: the shadow's forward
(batch sizes 1, 16 and 256: the record path predicts one consumer batch together) and, as the obvious
alternative it is compared with, the live model's own prediction + one SGD step of the same batch size; and
what the engine's non-finite check and the norm guard cost per update together: as they were before
stop 34 (``all_finite``, then the guard's norms of the gradient and the weights) and as they are
(``finite_norm``, whose norm the guard reuses; the weights' norm only for a step above ``r``). Prints a Markdown table.

    flock /tmp/ferret-bench.lock .venv/bin/python -m benchmarks.guard.shadow_cost --model mnistnet
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

from ferret_core.engine.stage_update import all_finite
from ferret_core.engine.step_guard import finite_norm, step_scale
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
    weights = f"{sum(p.numel() for p in params):,} weights"
    scale = 5.0 / float(torch.cat([g.flatten() for g in grads]).norm())  # a real gradient's norm (3–6 here)
    real = [g * scale for g in grads]  # lr 0.01: a step of 0.05, below r = 0.1
    tiny = 1e-9  # a ratio every step exceeds: the guard reads the weights' norm as well
    rows = {
        "before (stop 34): all_finite, then the gradient's and the weights' norms": lambda: (
            all_finite(real),
            step_scale(params, real, 0.01, tiny),
        ),
        "now, step below r: finite_norm, its norm reused, the weights not read": lambda: step_scale(
            params, real, 0.01, 0.1, finite_norm(real)
        ),
        "now, step above r: finite_norm, its norm reused, the weights' norm read": lambda: step_scale(
            params, real, 0.01, tiny, finite_norm(real)
        ),
    }
    print(f"\n| non-finite check + norm guard per update, {weights} | ms |")
    print("|---|---|")
    for name, call in rows.items():
        print(f"| {name} | {per_item_ms(call, 1, 100):.3f} |")

if __name__ == "__main__":
    main()
