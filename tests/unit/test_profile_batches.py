"""Per-batch-size step times in profiles: old files stay readable, interpolation, clear errors, profiler."""

from __future__ import annotations

import json

import pytest

from ferret_core.errors import ProfileError
from ferret_core.planning.profiler import profile_model
from ferret_core.profile import LayerProfile, ModelProfile
from ferret_core.zoo import build_model
from services.cli import main


def batched_profile() -> ModelProfile:
    layers = (
        LayerProfile("a", 1.0, 2.0, 10, 4, batch_times=((10, 5.0, 8.0), (20, 9.0, 14.0))),
        LayerProfile("b", 0.5, 1.0, 10, 4, batch_times=((10, 1.5, 3.0), (20, 2.5, 5.0))),
    )
    return ModelProfile("tiny", (3,), layers)


def test_old_profiles_answer_only_for_their_base_batch() -> None:
    profile = ModelProfile("tiny", (3,), (LayerProfile("a", 1.0, 2.0, 10, 4),))
    assert profile.batch_sizes == (1,)
    assert profile.layer_times(1) == ((1.0, 2.0),)
    with pytest.raises(ProfileError, match=r"--batch-sizes 1,8"):
        profile.layer_times(8)


def test_measured_sizes_exact_and_between_them_interpolated() -> None:
    profile = batched_profile()
    assert profile.batch_sizes == (1, 10, 20)
    assert profile.layer_times(10) == ((5.0, 8.0), (1.5, 3.0))
    assert profile.layer_times(15) == ((7.0, 11.0), (2.0, 4.0))
    t_f, t_b = profile.layer_times(4)[0]
    assert t_f == pytest.approx(1.0 + 3 / 9 * 4.0) and t_b == pytest.approx(2.0 + 3 / 9 * 6.0)
    with pytest.raises(ProfileError, match="not for 21"):
        profile.layer_times(21)


def test_round_trip_and_at_batch() -> None:
    profile = batched_profile()
    again = ModelProfile.from_dict(json.loads(json.dumps(profile.to_dict())))
    assert again == profile
    at10 = profile.at_batch(10)
    assert at10.base_batch == 10 and [layer.t_f for layer in at10.layers] == [5.0, 1.5]
    assert at10.layer_times(1) == profile.layer_times(1) and at10.layer_times(20) == profile.layer_times(20)
    assert profile.at_batch(1) is profile


def test_inconsistent_batch_sizes_are_rejected() -> None:
    layers = (
        LayerProfile("a", 1.0, 2.0, 10, 4, batch_times=((10, 5.0, 8.0),)),
        LayerProfile("b", 0.5, 1.0, 10, 4),
    )
    with pytest.raises(ProfileError, match="same batch_times"):
        ModelProfile("tiny", (3,), layers)
    with pytest.raises(ProfileError, match="batch_times"):
        ModelProfile.from_dict({"model": "m", "input_shape": [3], "layers": [
            {"t_f": 1, "t_b": 1, "params": 1, "activations": 1, "batch_times": [{"batch": 2}]}]})


def test_profiler_times_further_batch_sizes() -> None:
    model = build_model("mlp", num_classes=3, in_features=8, seed=0)
    profile = profile_model(model, warmup=0, repeats=1, batch_sizes=(1, 4))
    assert profile.batch_sizes == (1, 4)
    assert all(len(layer.batch_times) == 1 and layer.batch_times[0][0] == 4 for layer in profile.layers)
    assert profile.meta["batch_sizes"] == [1, 4]


def test_profile_cli_batch_sizes(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "p.json"
    code = main.main(["profile", "--model", "mlp", "--warmup", "0", "--repeats", "1", "--batch-sizes", "1,3",
                      "--out", str(out)])
    assert code == 0
    assert ModelProfile.load(out).batch_sizes == (1, 3)
    assert "batch 3:" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main.main(["profile", "--model", "mlp", "--batch-sizes", "0,x", "--out", str(out)])


def test_stage_times_of_a_step() -> None:
    from ferret_core.errors import ConfigError
    from ferret_core.plan import Partition
    from ferret_core.schedule.actions import Action, Kind
    from ferret_core.schedule.stage_times import StageTimes
    from ferret_core.schedule.step_shape import StepShape

    times = StageTimes.from_profile(batched_profile(), Partition((0, 1, 2)))
    f0, f1, b1 = Action(Kind.F, 0, 0, 7), Action(Kind.F, 0, 1, 7), Action(Kind.B, 0, 1, 7)
    assert times.duration(f1, False) == (0.0, 0.5) and times.duration(b1, True) == (0.5, 1.5)
    assert times.duration(f1, False, StepShape(batch=10)) == (0.0, 1.5)
    assert times.duration(f1, False, StepShape(batch=15, forward_passes=2)) == (0.0, 4.0)
    # overhead only before the stage-0 forward: a whole-model F+B of 10 and a forward of 20
    shape = StepShape(batch=10, overhead=((10, True), (20, False)))
    assert times.duration(f0, False, shape) == (0.0, 5.0 + (5.0 + 1.5 + 8.0 + 3.0) + (9.0 + 2.5))
    assert times.duration(f1, False, shape) == (0.0, 1.5)
    assert StageTimes.instant(2).duration(f1, False, StepShape(batch=99)) == (0.0, 0.0)
    with pytest.raises(ConfigError, match="batch_times"):
        StageTimes((1.0, 1.0), (1.0, 1.0)).duration(f1, False, StepShape(batch=2))
