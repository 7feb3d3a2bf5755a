"""ferret bench: spec expansion, CSV resume, table formatting, the clear error for a missing method,
budgets by bisection, and the same command twice giving identical tables (a tiny real case)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from ferret_core.errors import ConfigError, FerretError
from services.bench.budgets import Budgets, resolve_budgets
from services.bench.capabilities import Capabilities, NotAvailableError
from services.bench.driver import BenchOptions, run_experiment
from services.bench.experiments import MNIST, PRESETS, experiment, preset
from services.bench.results_csv import COLUMNS, RunsCsv
from services.bench.specs import Arm, ExperimentSpec, Setting
from services.bench.tables import Cell, Row, markdown, ranks, spearman
from services.cli.main import main
from services.config.data_root import default_data_root

# runs that read MNIST from the default data root (the checkout's ../shared/data, else the user's cache)
needs_mnist = pytest.mark.skipif(
    not (default_data_root() / "MNIST" / "raw").is_dir(),
    reason=f"MNIST not found under the default data root {default_data_root()} (see README, Data)",
)

MAIN_ONLY = Capabilities(
    methods=("oracle", "1-skip", "ferret"),
    algorithms=("vanilla",),
    compensators=("none", "step-aware", "gap-aware", "fisher", "iter-fisher", "iter-fisher-cf"),
    fixed_plan=False,
)


def test_spec_expands_settings_arms_seeds_with_unique_keys() -> None:
    spec = experiment("overall", preset("quick"), seeds=3, items=7)
    runs = spec.expand()
    assert len(runs) == len(spec.settings) * len(spec.arms) * 3
    assert len({r.key for r in runs}) == len(runs)
    assert [r.seed for r in runs[:3]] == [0, 1, 2]  # seeds innermost
    assert {r.items for r in runs} == {7}


@pytest.mark.parametrize("name", ["overall", "algorithms", "pipelines", "compensation"])
@pytest.mark.parametrize("chosen", sorted(PRESETS))
def test_every_experiment_expands_under_every_preset(name: str, chosen: str) -> None:
    spec = experiment(name, preset(chosen))
    assert spec.expand()


def test_algorithms_leave_camel_to_vanilla_and_compensation_fixes_the_plan() -> None:
    algorithms = experiment("algorithms", preset("standard"))
    assert {a.algorithm for a in algorithms.arms if a.method == "camel"} == {"vanilla"}
    compensation = experiment("compensation", preset("quick"))
    assert all(a.fixed_plan and a.method == "ferret" for a in compensation.arms)
    assert {a.budget for a in compensation.arms} == {"M+", "M"}


def test_bad_specs_are_refused() -> None:
    with pytest.raises(ValueError, match="budget"):
        Arm("x", "ferret", "M++")
    setting = Setting("mnist", "mnistnet", "p.json")
    with pytest.raises(ValueError, match="share"):
        ExperimentSpec("e", (setting,), (Arm("a", "oracle"), Arm("a", "oracle")), (0,), 10)


def _row(key: str, **values: object) -> dict[str, object]:
    row: dict[str, object] = dict.fromkeys(COLUMNS)
    row.update(key=key, **values)
    return row


def test_csv_resume_keeps_rows_and_refuses_to_overwrite(tmp_path: Path) -> None:
    path = tmp_path / "runs.csv"
    table = RunsCsv(path, resume=False)
    table.append(_row("a", oacc=12.5, seed=0, peak_bytes=100))
    with pytest.raises(ConfigError, match="--resume"):
        RunsCsv(path, resume=False)
    resumed = RunsCsv(path, resume=True)
    assert resumed.keys() == {"a"}
    (row,) = resumed.rows()
    assert row["oacc"] == 12.5 and row["seed"] == 0 and row["peak_bytes"] == 100 and row["tacc"] is None
    path.write_text("other,columns\n")
    with pytest.raises(ConfigError, match="columns"):
        RunsCsv(path, resume=True)


def test_cell_is_mean_and_standard_error() -> None:
    cell = Cell.of([1.0, 2.0, 3.0, 6.0])
    assert cell.mean == pytest.approx(3.0)
    assert cell.se == pytest.approx(math.sqrt(14 / 3) / 2)
    assert Cell.of([4.0]).se == 0.0
    assert Cell.of([]).empty and Cell.of([]).text() == "—"
    assert Cell(-0.001, 0.0, 1).text() == "0.00 ± 0.00"  # no "-0.00"
    assert Cell(1.5, math.nan, 1).text() == "1.50"  # a published number without its error


def test_markdown_marks_best_bold_second_underlined_and_skips_excluded() -> None:
    cells = {"a": Cell(1.0, 0.1, 2), "b": Cell(3.0, 0.2, 2), "c": Cell(2.0, 0.3, 2), "ref": Cell(9.0, 0.0, 2)}
    table = markdown(["ref", "a", "b", "c"], [Row("s", cells)], excluded_from_ranking=("ref",))
    lines = table.splitlines()
    assert lines[0] == "| Setting | ref | a | b | c |"
    assert lines[2] == "| s | 9.00 ± 0.00 | 1.00 ± 0.10 | **3.00** ± 0.20 | <u>2.00</u> ± 0.30 |"
    assert ranks(cells, higher_is_better=False) == {"a": 1, "c": 2}
    ties = {"a": Cell(1.001, 0, 1), "b": Cell(0.999, 0, 1), "c": Cell(0.5, 0, 1)}
    assert ranks(ties) == {"a": 1, "b": 1, "c": 2}  # equal as printed


def test_spearman() -> None:
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert math.isnan(spearman([1, 2], [1, 2]))


def test_missing_method_stops_the_bench_naming_it_and_what_registers_it() -> None:
    spec = experiment("overall", preset("quick"))
    with pytest.raises(NotAvailableError) as caught:
        MAIN_ONLY.check(spec)
    message = str(caught.value)
    assert isinstance(caught.value, FerretError) and isinstance(caught.value, LookupError)
    expected_parts = ("'random-n'", "'camel'", "buffering baselines", "pipedream-2bw", "pipeline schedules")
    for expected in (*expected_parts, "--only-available"):
        assert expected in message
    kept, dropped = MAIN_ONLY.runnable(spec)
    assert [a.column for a in kept.arms] == ["oracle", "1-skip", "ferret-M+"]
    assert len(dropped) == 5


def test_compensation_needs_fixed_plans_and_the_lean_compensator() -> None:
    message = "; ".join(MAIN_ONLY.missing(experiment("compensation", preset("quick"))))
    assert "--plan" in message and "fixed plan" in message and "'iter-fisher-lean'" in message


def test_this_checkout_capabilities_come_from_simulate() -> None:
    from services.cli.main import build_parser

    caps = Capabilities.from_parser(build_parser())
    assert {"oracle", "1-skip", "ferret"} <= set(caps.methods)
    assert "none" in caps.compensators


def test_m_minus_is_the_smallest_budget_keeping_ms_partition() -> None:
    setting = Setting("mnist", "mnistnet", "p.json")
    threshold = 600_000  # below it the planner picks another partition

    def plan(_: Setting, budget: int | None) -> dict[str, object] | None:
        if budget is not None and budget < 200_000:
            return None
        partition = [0, 2, 4] if budget is not None and budget < threshold else [0, 4]
        return {"partition": partition, "min_feasible_bytes": 200_000, "planned_bytes": 2_000_000}

    budgets = resolve_budgets(setting, plan, lambda _: 1_000_000)
    assert budgets.m == 1_000_000 and budgets.absolute_min == 200_000
    assert threshold <= budgets.m_minus <= threshold + 1_000
    assert budgets.bytes_for("M+") is None and budgets.bytes_for("M") == 1_000_000
    assert budgets.bytes_for("sweep2") == (budgets.m_minus + 1_000_000) // 2
    assert budgets.bytes_for("sweep4") == 1_500_000
    assert Budgets.from_dict(budgets.to_dict()) == budgets


@needs_mnist
def test_same_command_twice_gives_identical_tables(tmp_path: Path) -> None:
    tiny = dataclasses.replace(preset("quick"), items=4, seeds=1, test_items=5, overall=(MNIST,))
    caps = dataclasses.replace(MAIN_ONLY, methods=("oracle", "1-skip"))
    tables = []
    for out in (tmp_path / "one", tmp_path / "two"):
        options = BenchOptions(preset=tiny, out=out, jobs=2, only_available=True, command="ferret bench overall")
        outcome = run_experiment("overall", options, caps, main)
        assert outcome.failed == 0 and outcome.ran == 2
        tables.append((out / "overall" / "tables.md").read_text())
        assert (out / "overall" / "oacc_vs_memory.png").stat().st_size > 0
    assert tables[0] == tables[1]
    assert "| mnist/mnistnet |" in tables[0] and "|   paper |" in tables[0]
    again = run_experiment("overall", dataclasses.replace(options, resume=True), caps, main)
    assert again.ran == 0 and again.skipped == 2
    (out / "overall" / "tables.md").unlink()
    redrawn = run_experiment("overall", dataclasses.replace(options, tables_only=True), caps, main)
    assert redrawn.ran == 0 and (out / "overall" / "tables.md").read_text() == tables[1]
    with pytest.raises(ConfigError, match="--tables-only"):
        run_experiment("overall", dataclasses.replace(options, out=tmp_path / "none", tables_only=True), caps, main)


def test_simulate_test_items_are_evenly_spaced_over_the_test_split() -> None:
    import numpy as np

    from ferret_core.data.dataset import Dataset
    from services.cli.simulate_cmd import fewer_test_items

    x = np.zeros((10, 1), dtype=np.float32)
    y = np.arange(10, dtype=np.int64)
    dataset = Dataset("d", x, y, x.copy(), y.copy(), 10, (1,), tasks_train=y // 2, tasks_test=y // 2)
    assert fewer_test_items(dataset, None) is dataset and fewer_test_items(dataset, 50) is dataset
    five = fewer_test_items(dataset, 5)
    assert five.y_test.tolist() == [0, 2, 4, 6, 8] and five.tasks_test is not None
    assert five.tasks_test.tolist() == [0, 1, 2, 3, 4] and five.x_test.shape == (5, 1)
    assert fewer_test_items(dataset, 3).y_test.tolist() == [0, 4, 8]
    assert five.y_train.tolist() == list(range(10))  # the stream is untouched


@pytest.mark.parametrize("name", ["overall", "algorithms", "pipelines", "compensation"])
def test_every_report_and_plot_renders_from_rows(name: str, tmp_path: Path) -> None:
    from services.bench import plots, reports
    from services.bench.driver import REPORTS

    spec = experiment(name, preset("quick"))
    rows = []
    for i, run in enumerate(spec.expand()):
        arm = run.arm
        rows.append({
            "key": run.key, "setting": run.setting.id, "column": arm.column, "method": arm.method,
            "budget": arm.budget, "algorithm": arm.algorithm, "seed": run.seed,
            "compensator": arm.compensator or ("iter-fisher" if arm.method == "ferret" else "none"),
            "oacc": 10.0 + (i * 7919) % 50, "tacc": 5.0 + (i * 104729) % 40,
            "peak_bytes": 2**20 * (1 + (i * 31) % 9), "adaptation_rate": 1.0 + i % 5,
        })  # fmt: skip
    budgets = {"mnist/mnistnet|p|300": Budgets("mnist/mnistnet", 3_000_000, 2_000_000, 1_000_000, 9_000_000)}
    text = REPORTS[name](rows, budgets)
    assert "**" in text and "<u>" in text and "—" not in text.split("### Goals")[0].split("paper")[0]
    if name == "pipelines":
        assert "Spearman" in text and "best other ÷ Ferret" in text and "asynchronous above" in text
        assert plots.sweep(rows, tmp_path / "s.png") and plots.rate_vs_oacc(rows, tmp_path / "r.png")
    if name == "compensation":
        assert "Goals at M+" in text
        assert plots.compensation(rows, tmp_path / "c.png")
    if name == "overall":
        assert "Ferret M above Random-N, Last-N and Camel on" in text and "paper's ratio" in text
        assert plots.oacc_vs_memory(rows, tmp_path / "o.png", "t")
    assert reports.settings_of(rows) == [s.id for s in spec.settings]


def test_memory_to_reach_reads_the_least_memory_reaching_the_common_target() -> None:
    from services.bench.reports import memory_to_reach, rate_and_oacc

    def point(budget: str, oacc: float, mib: float, rate: float | None = None) -> tuple[str, Cell, Cell, Cell]:
        return budget, Cell(oacc, 0.0, 5), Cell(mib, 0.0, 5), Cell.of([] if rate is None else [rate])

    points = {
        "dapple": [point("M-", 20.0, 10.0), point("M", 30.0, 40.0), point("M+", 31.0, 80.0)],
        "ferret": [point("M-", 25.0, 8.0, 1.0), point("M", 35.0, 12.0, 3.0), point("M+", 34.0, 70.0, 2.0)],
    }
    target, need, ratio = memory_to_reach(points)
    assert target == 31.0  # dapple's best; Ferret first reaches it at 12 MiB
    assert need == {"dapple": 80.0, "ferret": 12.0}
    assert ratio == pytest.approx(80.0 / 12.0)
    assert memory_to_reach({"dapple": points["dapple"]})[2] is None
    pairs = rate_and_oacc(points["ferret"])
    assert pairs == [(1.0, 25.0), (3.0, 35.0), (2.0, 34.0)]
    assert spearman(*zip(*pairs, strict=True)) == pytest.approx(1.0)
    assert rate_and_oacc(points["dapple"]) == []  # no plan's R_F: not in the figure


def test_short_stream_settings_pass_their_learning_rate_to_every_run() -> None:
    from services.bench.runner import simulate_argv

    spec = experiment("overall", preset("standard"))
    rates = {(r.setting.model, r.setting.lr) for r in spec.expand()}
    assert rates == {("mnistnet", 0.02), ("convnet", 0.05), ("mlp", 0.05)}  # one lr per setting, every method
    run = spec.expand()[0]
    argv = simulate_argv(run, None)
    assert argv[argv.index("--lr") + 1] == "0.02" and "--cache-dir" in argv
    assert "|lr0.02|" in run.key
    assert {s.lr for s in PRESETS["full"].overall} == {1e-3}  # the paper's protocol

def test_the_papers_ferret_runs_algorithm_1_whatever_the_cli_default() -> None:
    """The CLI's default compensator is iter-fisher-lean; the bench reproduces the paper, whose
    Ferret runs Iter-Fisher (Algorithm 1): an arm that names no compensator is pinned to it."""
    from services.bench.runner import simulate_argv
    from services.bench.specs import RunSpec

    def compensator(arm: Arm) -> str | None:
        argv = simulate_argv(RunSpec("overall", MNIST, arm, 0, 10), 10**8)
        return argv[argv.index("--compensator") + 1] if "--compensator" in argv else None

    assert compensator(Arm("ferret-M", "ferret", "M")) == "iter-fisher"
    assert compensator(Arm("ferret-M", "ferret", "M", compensator="iter-fisher-lean")) == "iter-fisher-lean"
    assert compensator(Arm("1-skip", "1-skip")) is None


@needs_mnist
def test_budget_m_is_measured_under_each_arms_algorithm(tmp_path: Path) -> None:
    """M is PipeDream-2BW's measured bytes *under the arm's algorithm* (its state included): under ER it
    exceeds Vanilla's M by at least the replay buffer's bytes, and Ferret under ER is feasible at it
    (at Vanilla's M it was not: the 10 failed runs of the algorithms experiment)."""
    from services.bench.budgets import plan_with_cli
    from services.bench.driver import _budget_key, _budgets
    from services.bench.experiments import SPLIT_MNIST

    arms = (Arm("ferret-M", "ferret", "M"), Arm("ferret-M", "ferret", "M", algorithm="er"))
    spec = ExperimentSpec("algorithms", (SPLIT_MNIST,), arms, (0,), items=10, test_items=20)
    options = BenchOptions(preset=preset("quick"), out=tmp_path, jobs=2)
    (tmp_path / "algorithms").mkdir()
    budgets = _budgets(spec, tmp_path / "algorithms", options, main)
    vanilla = budgets[_budget_key(SPLIT_MNIST, 10)]
    er = budgets[_budget_key(SPLIT_MNIST, 10, "er")]
    assert (vanilla.algorithm, er.algorithm) == ("vanilla", "er")
    buffer_bytes = 5000 * 28 * 28 * 4  # the default 5000 float32 MNIST images
    assert er.m >= vanilla.m + buffer_bytes
    plan_er = plan_with_cli(main, algorithm="er")
    assert plan_er(SPLIT_MNIST, er.m) is not None  # Ferret at M under ER: feasible
    # (at Vanilla's M it was infeasible while Iter-Fisher's v_r, v_a were counted at every stage; counted only
    # where a stage can be stale, a 2-stage plan fits there now, so that reading no longer separates them)
    assert er.absolute_min <= er.m_minus <= er.m
    assert _budgets(spec, tmp_path / "algorithms", options, main) == budgets  # kept, not measured again


@needs_mnist
def test_short_stream_presets_let_lwf_and_mas_act() -> None:
    """On 250 items 1-Skip trains ~50 of them, below LwF's and MAS's default refresh periods (1000 and 100
    trained items): both ran as Vanilla, bit for bit. The short-stream presets refresh every 10 trained
    items, so the algorithm's state exists by the end of the run (measured by the memory meter)."""
    from services.bench.runner import run_simulate, simulate_argv

    spec = experiment("algorithms", preset("standard"))
    for algorithm in ("lwf", "mas"):
        run = next(r for r in spec.expand() if r.arm.column == "1-skip" and r.arm.algorithm == algorithm)
        assert run.arm.refresh_every == 10 and f"|{algorithm}-every10|" in run.key
        report = run_simulate(simulate_argv(run, None))
        assert report["memory_breakdown"]["algorithm"] > 0, algorithm  # teacher / importances and anchor held
    assert all(a.refresh_every is None for a in experiment("algorithms", preset("full")).arms)


def test_plan_and_simulate_make_the_same_plan_given_the_same_byte_model() -> None:
    """`ferret plan` and `ferret simulate` plan through one function; their defaults differ on purpose
    (`--in-flight cap`, the wall clock's bound, vs `schedule`, exact on the virtual clock: docs/planner.md),
    and with the same options, `--algorithm` included, they make the same plan."""
    from ferret_core.ocl import AlgorithmSettings, make_algorithm
    from ferret_core.profile import ModelProfile
    from services.cli.main import build_parser
    from services.cli.plan_cmd import plan_for_algorithm
    from services.cli.simulate_cmd import ferret_plan

    profile_path = "benchmarks/profiles/mnistnet-batches.json"
    profile = ModelProfile.load(Path(profile_path))
    common = ["--profile", profile_path, "--compensator", "iter-fisher", "--budget", "60000000"]
    for algorithm in ("vanilla", "er", "lwf"):
        sim = build_parser().parse_args(["simulate", "--dataset", "split-mnist", "--method", "ferret",
                                         "--algorithm", algorithm, *common])
        made = ferret_plan(sim, profile, make_algorithm(algorithm, AlgorithmSettings()))
        for flags, expected_mode in (([], "cap"), (["--in-flight", "schedule"], "schedule")):
            args = build_parser().parse_args(["plan", "--algorithm", algorithm, *common, *flags])
            planned = plan_for_algorithm(args, profile, make_algorithm(algorithm, AlgorithmSettings()), in_flight="cap")
            assert ("virtual clock" in planned.memory_note) == (expected_mode == "schedule")
            if expected_mode == "schedule":
                assert planned.to_dict() == made.to_dict(), algorithm
    assert "virtual clock" in made.memory_note  # simulate's default: the schedule replay


def test_a_stage_with_no_compensated_call_is_a_nan_correction_not_a_crash() -> None:
    # the JSON report writes a stage's NaN mean correction as null (found by the standard preset, stop 30)
    from services.bench.runner import row_of
    from services.bench.specs import RunSpec

    run = RunSpec("compensation", MNIST, Arm("ferret-M", "ferret", "M", compensator="dc-asgd-a"), 0, 10)
    row = row_of(run, 10**8, {"oacc": 12.0, "relative_correction": [0.25, None]})
    assert row["relative_correction"] == "0.25;nan"


def test_sweep_every_puts_every_schedule_and_ferret_in_the_pipelines_sweep_and_the_command(tmp_path: Path) -> None:
    """``ferret bench pipelines --sweep every``: the memory-to-reach table's best other over every schedule,
    not only the preset's (standard: DAPPLE and Ferret); the tables' command says so."""
    from services.bench.experiments import SCHEDULES
    from services.cli import bench_cmd
    from services.cli.main import build_parser

    seen: list[BenchOptions] = []

    def fake_run(name: str, options: BenchOptions, *_: object) -> object:
        seen.append(options)
        raise NotAvailableError("stop here")

    argv = ["bench", "pipelines", "--preset", "standard", "--sweep", "every", "--out", str(tmp_path)]
    args = build_parser().parse_args(argv)
    with pytest.MonkeyPatch.context() as mp, pytest.raises(NotAvailableError):
        mp.setattr(bench_cmd, "run_experiment", fake_run)
        args.handler(args)
    [options] = seen
    assert options.preset.sweep_strategies == (*SCHEDULES, "ferret")
    assert options.command.endswith("--sweep every")
    spec = experiment("pipelines", options.preset)
    swept = {a.method for a in spec.arms if "@" in a.column}
    assert swept == {*SCHEDULES, "ferret"}
    assert experiment("pipelines", preset("standard")).arms != spec.arms  # the default stays the preset's


def test_ferrets_arms_plan_by_the_accuracy_objective_unless_told_rate(tmp_path: Path) -> None:
    """The default objective of `ferret bench` is the accuracy objective (issue 24); `--objective rate` runs the
    paper's R_F alone and the tables' command says so (the default is not written out)."""
    from services.cli import bench_cmd
    from services.cli.main import build_parser

    seen: list[BenchOptions] = []

    def fake_run(name: str, options: BenchOptions, *_: object) -> object:
        seen.append(options)
        raise NotAvailableError("stop here")

    for extra in ([], ["--objective", "rate"]):
        args = build_parser().parse_args(["bench", "overall", "--preset", "standard", "--out", str(tmp_path), *extra])
        with pytest.MonkeyPatch.context() as mp, pytest.raises(NotAvailableError):
            mp.setattr(bench_cmd, "run_experiment", fake_run)
            args.handler(args)
    default, rate = seen
    assert default.objective == "accuracy" and "--objective" not in default.command
    assert rate.objective == "rate" and rate.command.endswith("--objective rate")
    arms = experiment("overall", default.preset, objective=default.objective).arms
    assert {a.objective for a in arms if a.method == "ferret"} == {"accuracy"}
    assert {a.objective for a in arms if a.method != "ferret"} == {"rate"}  # only Ferret plans by it
