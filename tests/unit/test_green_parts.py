"""`ecotrain green`'s parts: the levers per recipe, trial values as overrides, the pruner's rule, the
Pareto front, the payback arithmetic and the seed checks (the search end to end: tests/integration/test_green_search.py)."""

import math

import optuna
import pytest

from ecotrain.config import load_config
from ecotrain.base.errors import ConfigError
from ecotrain.green import space
from ecotrain.cli.commands.green import confirm_seeds
from ecotrain.assembly.green_confirm import check_seeds, payback_runs
from ecotrain.green.output import pareto
from ecotrain.assembly.green_search import Row, at, gap_pruner, load_factor, pace, skip_reason

CNN = "recipes/mnist1d_cnn.yaml"


def test_levers_follow_the_recipe():
    names = lambda cfg, only=None: [lv.name for lv in space.levers(cfg, only)[0]]  # noqa: E731
    # the CNN: every lever but a transformer's depth and mixed fidelity (its flat head takes one input size)
    assert names(load_config(CNN)) == [n for n in space.ALL if n not in ("depth", "fidelity")]
    lm, why = space.levers(load_config(CNN, ["model.name=charlm", "task.name=language_model"]))
    assert {"prune", "selective"} & {lv.name for lv in lm} == set()
    assert {"width", "depth", "fidelity"} <= {lv.name for lv in lm}
    assert "charlm" in why["prune"] and "language_model" in why["selective"]
    assert "fidelity" in names(load_config("recipes/glyphs_cnn2d.yaml"))
    assert names(load_config(CNN), ["schedule", "batch"]) == ["schedule", "batch"]
    with pytest.raises(ConfigError, match="--levers prune: does not apply"):
        space.levers(load_config(CNN, ["model.name=resnet"]), ["prune"])
    with pytest.raises(ConfigError, match="unknown lever 'speed'"):
        space.levers(load_config(CNN), ["speed"])
    with pytest.raises(ConfigError, match="validation split"):
        space.levers(load_config(CNN, ["data.val_split=0"]), ["schedule"])


def test_trial_values_become_overrides_that_load():
    cfg = load_config(CNN)
    params = {"samples": 0.3, "batch": 25, "width": 0.8, "prune": 0.3, "keep": 0.5, "stability": True}
    over = space.to_overrides(cfg, params, base_samples=600_000, evals=4)
    got = load_config(CNN, over)
    assert got.data.batch_size == 25 and got.loop.max_steps == 7200  # 0.3 x 600k samples / 25
    assert got.loop.eval_every == 1800 and got.loop.max_epochs is None
    assert got.model.kwargs["channels"] == 20
    assert [m.name for m in got.methods] == ["prune", "selective_backprop", "stability_stop"]
    assert got.methods[0].end_step == 3600
    assert space.predicted_cost(params) is None  # the width changes the per-sample work: unknown before training
    assert space.predicted_cost({"samples": 0.3, "batch": 25, "ema": True}) == 0.3
    assert space.batch_choices(100) == [16, 25, 32, 50, 75, 100]
    assert space.batch_choices(20) == [8, 10, 15, 20]


def test_a_measured_search_tries_larger_batches_with_a_square_root_lr():
    from ecotrain.assembly.green_search import larger_batches

    assert larger_batches({"epochs": 162, "samples_seen": 583_962}) == 1802  # the demo recipe's baseline
    assert larger_batches({}) == 0 and larger_batches({"epochs": -1, "samples_seen": 10}) == 0
    # a max-steps run inside its first epoch (an LM's) has begun one: it gets larger batches too
    assert larger_batches({"epochs": 0, "samples_seen": 1920}) == 960
    assert space.batch_choices(100, 1802) == [16, 25, 32, 50, 75, 100, 200, 300, 500]
    assert space.batch_choices(100, 250) == [16, 25, 32, 50, 75, 100, 200]  # two steps an epoch at least
    cfg = load_config(CNN)
    got = load_config(CNN, space.to_overrides(cfg, {"samples": 0.83, "batch": 500}, base_samples=600_000))
    assert got.data.batch_size == 500 and got.loop.max_steps == 996
    assert got.optim.lr == pytest.approx(cfg.optim.lr * 5 ** 0.5, rel=1e-5)
    small = load_config(CNN, space.to_overrides(cfg, {"samples": 0.3, "batch": 25}, base_samples=600_000))
    assert small.optim.lr == cfg.optim.lr  # a smaller batch keeps the recipe's LR, as the FLOPs search did
    import optuna

    chosen = [space.Lever("schedule", ""), space.Lever("batch", "")]
    assert space.suggest(optuna.trial.FixedTrial({"samples": 0.9, "batch": 500}), chosen, 100, 1802) == \
        {"samples": 0.9, "batch": 500}
    with pytest.raises(ValueError):  # a FLOPs search: no batch above the recipe's
        space.suggest(optuna.trial.FixedTrial({"samples": 0.3, "batch": 500}), chosen, 100)


def test_the_search_never_proposes_pruning_with_ema():
    """Prune refuses EMA (methods/prune.py): a trial proposing both ended the whole search with a
    config error; EMA is proposed only where pruning is off."""
    import optuna

    chosen = [space.Lever("prune", ""), space.Lever("ema", "")]
    on = space.suggest(optuna.trial.FixedTrial({"prune": 0.3, "ema": True}), chosen, 100)
    off = space.suggest(optuna.trial.FixedTrial({"prune": 0.0, "ema": True}), chosen, 100)
    assert on == {"prune": 0.3} and off == {"prune": 0.0, "ema": True}


def test_the_lr_factor_multiplies_the_batch_rule():
    cfg = load_config(CNN)  # lr 0.01, batch 100
    lr = lambda params: load_config(CNN, space.to_overrides(cfg, params, base_samples=600_000)).optim.lr  # noqa: E731
    assert lr({"samples": 0.5}) == lr({"samples": 0.5, "lr": 1.0}) == 0.01
    assert lr({"samples": 0.5, "lr": 2.0}) == pytest.approx(0.02)
    assert lr({"samples": 0.5, "batch": 500, "lr": 1.4}) == pytest.approx(0.01 * 5 ** 0.5 * 1.4, rel=1e-5)
    assert lr({"samples": 0.5, "batch": 50, "lr": 0.7}) == pytest.approx(0.007)  # a smaller batch: the factor only
    # cost-neutral: the FLOPs prediction and the cost model's features ignore it
    assert space.predicted_cost({"samples": 0.4, "lr": 2.0}) == 0.4


def test_a_short_schedule_gets_a_short_warmup():
    over = space.to_overrides(load_config(CNN), {"samples": 0.001, "batch": 100}, base_samples=600_000)
    assert "schedule.warmup=0" in over and "loop.max_steps=6" in over


def test_the_pruner_allows_more_early_and_the_tolerance_at_the_end():
    study = optuna.create_study(pruner=gap_pruner(0.01))
    def pruned(step, deficit):
        t = study.ask()
        t.report(deficit, step)
        return t.should_prune()
    assert not pruned(25, 0.5)  # before WARMUP: never
    assert pruned(50, 0.06) and not pruned(50, 0.04)  # at 50%: 0.01 + 0.08 x 0.5 = 0.05
    assert pruned(75, 0.031) and not pruned(75, 0.029)
    assert not pruned(100, 0.5)  # the end: the constraint decides, not the pruner


def test_a_mixed_fidelity_trial_is_not_pruned_while_its_inputs_are_half_size():
    study = optuna.create_study(pruner=gap_pruner(0.01))
    def pruned(step, deficit, prune_from=None):
        t = study.ask()
        if prune_from is not None:
            t.set_user_attr("prune_from", prune_from)
        t.report(deficit, step)
        return t.should_prune()
    assert pruned(50, 0.8)  # chance accuracy at 50%: pruned ...
    assert not pruned(50, 0.8, prune_from=51)  # ... unless it trained on half-size inputs until then
    assert pruned(75, 0.8, prune_from=51)  # at full size since: read as any trial


def test_a_schedule_of_fewer_steps_gets_a_wider_allowance():
    study = optuna.create_study(pruner=gap_pruner(0.01))
    def pruned(step, deficit, base_steps, trial_steps):
        t = study.ask()
        t.set_user_attr("pace", pace(base_steps, trial_steps))
        t.report(deficit, step)
        return t.should_prune()
    assert pace(6000, 6000) == pace(6000, 9000) == 1.0 and pace(6000, 1500) == 2.0
    assert pruned(50, 0.06, 6000, 6000) and pruned(50, 0.06, 6000, 12000)  # as long or longer: as before
    assert not pruned(50, 0.06, 6000, 1500) and pruned(50, 0.091, 6000, 1500)  # 0.01 + 0.08 x 0.5 x 2 = 0.09
    assert pruned(75, 0.5, 6000, 60)  # far behind is pruned however short


def test_a_trial_that_cannot_beat_the_best_feasible_or_the_baseline_is_skipped():
    def row(ratio, feasible):
        r = Row(0, "complete", {}, [])
        r.ratio, r.feasible = ratio, feasible
        return r
    none_feasible = [row(0.3, False)]
    # measured: the baseline (1x) is the yardstick before any trial is feasible
    assert skip_reason(2.7, 1.1, none_feasible, measured=True) == (
        "predicted 2.700x, no cheaper than the baseline (the fitted cost model's cheap end: 1.100x)")
    assert skip_reason(2.7, 0.9, none_feasible, measured=True) is None  # its band reaches under 1x: trained
    assert skip_reason(2.7, 1.1, none_feasible, measured=False) is None  # counted FLOPs: nothing feasible yet
    rows = [row(0.6, True), row(0.4, False)]
    assert skip_reason(0.7, 0.7, rows, measured=False) == "predicted 0.700x, no cheaper than the best feasible 0.600x"
    assert skip_reason(0.7, 0.55, rows, measured=True) is None and skip_reason(None, None, rows, True) is None


def test_the_load_factor_is_a_median_of_recent_probes_over_the_reference():
    assert load_factor([1.0], 2.0) == 0.5
    assert load_factor([9.0, 1.0, 1.2, 5.0], 1.0) == 1.2  # the last three: one wild reading moves nothing
    assert load_factor([1.0, 1.0, 3.0, 3.0], 1.5) == 2.0  # a load that stays is followed within two probes


def test_the_baseline_curve_is_read_at_a_fraction():
    curve = [(0.25, 0.5), (0.5, 0.7), (1.0, 0.9)]
    assert at(curve, 0.1) is None and at(curve, 0.5) == 0.7
    assert at(curve, 0.75) == pytest.approx(0.8) and at(curve, 2.0) == 0.9


def test_pareto_front():
    pts = [(1.0, 0.96), (0.3, 0.95), (0.5, 0.94), (0.2, 0.90), (0.3, 0.93)]
    assert pareto(pts) == [(0.2, 0.90), (0.3, 0.95), (1.0, 0.96)]


def test_payback_arithmetic():
    assert payback_runs(4.0, 0.7) == 6  # 5.7 runs: the 6th repays it
    assert payback_runs(3.5, 0.7) == 5  # exactly 5
    assert payback_runs(0.0, 0.5) == 0
    assert payback_runs(4.0, 0.0) is None and payback_runs(4.0, -0.1) is None  # no saving: never
    assert math.isclose(6.13 / 0.67, 9.149, rel_tol=1e-3) and payback_runs(6.13, 0.67) == 10


def test_confirmation_seeds_are_fresh():
    assert confirm_seeds("5") == "10-14" and confirm_seeds("0") is None and confirm_seeds("20,21") == "20,21"
    assert check_seeds([0, 1, 2], "10-14") == [10, 11, 12, 13, 14]
    with pytest.raises(ConfigError, match="includes design seed 2"):
        check_seeds([0, 1, 2], "2-6")
    with pytest.raises(ConfigError, match="at least 2 fresh seeds"):
        check_seeds([0], "10")


def test_without_optuna_it_is_one_line(monkeypatch):
    from ecotrain.assembly import green_search as search
    monkeypatch.setattr(search, "optuna", None)  # as when the `green` extra is not installed
    with pytest.raises(ConfigError, match=r"pip install 'ecotrain\[green\]'"):
        search.need_optuna()


def test_a_damaged_study_is_one_line_before_anything_trains(tmp_path):
    import sqlite3

    from ecotrain.assembly.green_search import check_study

    db = tmp_path / "study.db"
    check_study(db)  # none yet: a fresh search
    sqlite3.connect(db).execute("CREATE TABLE t (x)").connection.commit()
    check_study(db)  # a readable database: Optuna's own checks follow
    db.write_bytes(bytes((i * 167 + 13) % 256 for i in range(4096)))
    with pytest.raises(ConfigError) as err:
        check_study(db)
    assert str(err.value).startswith(f"{db}: the search's study database is damaged (file is not a database); "
                                     "move it away")
    (tmp_path / "dir.db").mkdir()
    with pytest.raises(ConfigError, match="dir.db: not a file"):
        check_study(tmp_path / "dir.db")


def test_a_measured_search_spends_its_budget_in_what_it_measured():
    from ecotrain.assembly.green_search import Row, Search

    s = Search(baseline={"val": 0.9, "cost": 2.0, "flops": 10.0, "samples": 100})
    s.rows.append(Row(0, "complete", {"batch": 500}, [], cost=0.5, flops=10.0))  # as many FLOPs, a quarter the energy
    s.probes.append({"run": "p", "cost": 0.3, "flops": 1.0})
    assert s.spent_runs(True) == pytest.approx((2.0 + 0.5) / 2.0 + 1.0 / 10.0)  # the probe: its FLOPs share
    # under load: a trial counts its load-corrected ratio, a probe still its FLOPs share
    s.rows.append(Row(1, "complete", {"batch": 500}, [], cost=1.5, ratio=0.25, flops=10.0, load_factor=3.0))
    s.probes.append({"run": "p001", "cost": 0.9, "flops": 1.0})
    assert s.spent_runs(True) == pytest.approx(1.0 + 0.25 + 0.25 + 2 * 1.0 / 10.0)
    assert s.spent_runs(False) == pytest.approx((10.0 + 10.0 + 1.0 + 10.0 + 1.0) / 10.0)  # FLOPs: what was counted


def test_model_size_and_fidelity_levers_become_overrides_that_load():
    lm = load_config("recipes/lm_green.yaml")  # d_model 192, 4 layers, 4 heads
    got = load_config("recipes/lm_green.yaml", space.to_overrides(
        lm, {"samples": 1.5, "width": 0.6, "depth": 0.5, "fidelity": 0.5}, base_samples=1920))
    assert got.model.kwargs["d_model"] == 116 and got.model.kwargs["d_model"] % 4 == 0  # heads divide the width
    assert got.model.kwargs["n_layers"] == 2 and got.loop.max_steps == 180  # 1.5 x 1920 / 16
    assert [(m.name, m.scales, m.until) for m in got.methods] == [("progressive_resize", [0.5], [0.5])]
    img = load_config("recipes/glyphs_cnn2d.yaml")
    got = load_config("recipes/glyphs_cnn2d.yaml", space.to_overrides(img, {"width": 0.6}, base_samples=57_600))
    assert got.model.kwargs["widths"] == [14, 29, 58]
    assert space.predicted_cost({"samples": 0.5, "depth": 0.5}) is None
    assert space.predicted_cost({"samples": 0.5, "fidelity": 0.5}) is None


def test_a_search_that_may_shrink_the_model_tries_more_samples():
    def high(chosen, measured):
        trial = optuna.create_study().ask()
        space.suggest(trial, [space.Lever(n, "") for n in chosen], 16, 0, measured=measured)
        return trial.distributions["samples"].high

    assert high(["schedule", "width"], True) == high(["schedule", "depth"], True) == 2.0  # smaller, longer
    assert high(["schedule"], True) == 1.0  # the model as it is: up to all the samples
    assert high(["schedule", "width"], False) == 0.5  # a FLOPs search: the cheap end only


def test_the_search_says_when_the_validation_split_cannot_resolve_the_tolerance(tmp_path):
    from ecotrain.assembly.green_search import Options, resolution

    opts = Options(CNN, [], tmp_path, tolerance=0.01)
    said = resolution(opts, 143)  # digits' validation split: one sample is 0.7 points
    assert said is not None and "143 samples" in said and "1000 samples or more" in said
    assert resolution(opts, 2400) is None  # one sample is 0.04 points: resolved
    assert resolution(Options(CNN, [], tmp_path, tolerance=0.05), 300) is None
    assert resolution(Options(CNN, [], tmp_path, tolerance=0.02, metric="val_bits_per_byte"), 10) is None
    assert resolution(opts, 0) is None and resolution(Options(CNN, [], tmp_path, tolerance=0.0), 143) is None


def test_each_lever_is_tried_alone_before_the_sampler_combines_them():
    cfg = load_config("recipes/glyphs_cnn2d.yaml")
    levers, _ = space.levers(cfg)
    first = space.first_trials(levers, cfg.data.batch_size, measured=True)
    changed = [{k for k, v in f.items() if v != {"samples": 1.0, "batch": 64, "lr": 1.0, "width": 1.0,
                                                  "fidelity": 0.0, "keep": 1.0, "ema": False, "stability": False}[k]}
               for f in first]
    assert changed == [{"width"}, {"fidelity"}, {"samples"}]  # one lever each, the rest as the recipe has it
    assert first[0]["width"] == 0.6 and first[2]["samples"] == 0.5
    for f in first:  # each one is a value the search's own space holds
        trial = optuna.trial.FixedTrial(f)
        assert space.suggest(trial, levers, 64, 0, measured=True) == space.values(f)
    flops = space.first_trials([space.Lever("schedule", ""), space.Lever("batch", "")], 100, measured=False)
    assert flops == [{"samples": 0.5, "batch": 100}]  # a FLOPs search: half the samples, its cheapest cut's top


@pytest.mark.parametrize("flags, words", [
    (["--seeds-confirm", "²"], "--seeds"),
    (["--seeds-confirm", "3", "--until-decided", "--max-seeds", "0"], "--max-seeds 0"),
])
def test_confirmation_flags_are_refused_before_the_search_trains(tmp_path, capsys, flags, words):
    from ecotrain.cli import main

    code = main(["green", "recipes/mnist1d_cnn.yaml", "--out", str(tmp_path / "g"), *flags])
    err = capsys.readouterr().err
    assert code == 2 and words in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "g").exists()  # nothing trained, nothing written
