"""Profiles shared by the planner tests."""

from __future__ import annotations

from ferret_core.profile import LayerProfile, ModelProfile

# Golden case (a) of the planner's specification (docs/planner.md): (t_f, t_b, params, activations) per unit.
GOLDEN_A_UNITS = ((1, 2, 320, 5408), (3, 6, 18496, 9216), (2, 4, 1179776, 128), (0.2, 0.4, 1290, 10))


def profile_from(units: tuple[tuple[float, float, int, int], ...], name: str = "golden") -> ModelProfile:
    layers = tuple(
        LayerProfile(f"u{i}", float(tf), float(tb), int(w), int(a)) for i, (tf, tb, w, a) in enumerate(units)
    )
    return ModelProfile(model=name, input_shape=(1,), layers=layers)


def golden_a() -> ModelProfile:
    return profile_from(GOLDEN_A_UNITS)


def golden_b() -> ModelProfile:
    return profile_from(((1, 2, 1000, 100),) * 5)
