"""Back-fill ``saved_input`` / ``saved_output`` into the committed profiles without re-timing them.

The flags (whether a unit's input and output storages are among the tensors autograd saves, see
``ferret_core/profile.py``) depend only on the model's structure, not on the machine. This script sizes
each model once with the profiler (one untimed pass), checks that its ``params``, ``activations`` and
``saved`` equal the committed values, and writes the two flags into the committed file; every timing and
the ``meta`` block stay as they were. Run from the repository root:

    .venv/bin/python -m benchmarks.profiles.add_saved_flags
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from ferret_core.planning.profiler import profile_model
from ferret_core.profile import ModelProfile
from ferret_core.zoo import build_model

HERE = Path(__file__).resolve().parent
FILES = {
    "mlp.json": ("mlp", None),
    "mnistnet.json": ("mnistnet", None),
    "convnet.json": ("convnet", None),
    "resnet18-32.json": ("resnet18", 32),
    "resnet18-224.json": ("resnet18", 224),
    "mobilenet-32.json": ("mobilenet", 32),
    "mobilenet-224.json": ("mobilenet", 224),
}


def main() -> int:
    torch.set_num_threads(1)
    for file, (name, size) in FILES.items():
        path = HERE / file
        committed = ModelProfile.load(path)
        sized = profile_model(build_model(name, num_classes=10, input_size=size, seed=0), warmup=0, repeats=1)
        data = json.loads(path.read_text())
        for row, old, new in zip(data["layers"], committed.layers, sized.layers, strict=True):
            same = (old.params, old.activations, old.saved) == (new.params, new.activations, new.saved)
            if not same:
                print(f"{file}: unit {old.name} sizes differ from the model's; re-profile it", file=sys.stderr)
                return 1
            row["saved_input"] = new.saved_input
            row["saved_output"] = new.saved_output
        path.write_text(json.dumps(data, indent=2) + "\n")
        print(f"{file}: flags written for {len(data['layers'])} units", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
