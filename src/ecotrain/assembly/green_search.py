"""The search of `ecotrain green`: the cheapest recipe whose validation metric stays within a tolerance
of the baseline's, chosen on validation only (docs/green.md).

1. The baseline (the recipe as given) trains on the design seed; its validation metric and its cost
   are the reference, its validation curve the yardstick the pruner reads.
2. An Optuna study, stored in OUT/study.db (SQLite), minimises the cost (measured energy by default,
   each trial's own ledger; `--by co2e|money|cpu_seconds|flops`) under the constraint `deficit <= tolerance` (TPE with `constraints_func`),
   where the deficit is the baseline's validation metric minus the trial's. Every trial is an
   ordinary run in OUT/trials/tNNN (`fit(..., resume="auto")`).
3. Pruning on intermediate validation figures: each trial evaluates at 25/50/75/100% of its
   schedule and reports its deficit against the baseline's curve at the same fraction; the
   `GapPruner` stops a trial from 50% on when the deficit is past the tolerance plus a slack that
   shrinks to zero at the end, widened for a schedule of fewer steps than the baseline's (`pace`). Successive halving would rank trials against each other and so
   prune the cheap ones first, the very ones sought; the gap to the baseline is the constraint's own
   early reading. A trial whose cost is known before it trains (`space.predicted_cost`, counted
   FLOPs) and is no lower than the cheapest feasible one so far is not trained at all (`skipped`);
   for a measured cost, a model fitted on the trials measured so far (costmodel.py) skips a trial
   only when even its band's cheap end is no lower.
4. Resume: a killed search is started again with the same command. The sampler is re-seeded from
   the trial number before each `ask` (`seed * 1000 + number`), so a fresh process asks for the same
   values as the one that was killed; a trial left RUNNING by the killed process is continued under
   its own number and values (its run folder resumes from its checkpoint, exactly), and an
   intermediate figure it already reported is not reported again. Same history, same sampler seed,
   same suggestions: the resumed search gives the same trials and the same choice.

A measured cost (energy, CO2e, money, CPU-seconds) moves with the machine's load, so a trial is
never set against a baseline timed at another moment: before each trial a short calibration probe of
the baseline (`calibrate` x its steps, as an ordinary run in OUT/probes) is timed, and the trial's
ratio is its cost over the baseline's cost times the load factor: the median of the last three
probes' costs (that one the newest) over the median of three reference probes timed right after the
baseline's own run (one ~1 s probe is too noisy a yardstick alone: REFERENCE_PROBES): baseline,
probes, probe, trial, probe, trial, ..., in pairs (A, B, A, B). Energy where no meter exists is CPU-time based (accounting/energy.py
`cpu_time_kwh`: RAM power counted over the time the run held a CPU), so a run that waited for a core
is not charged for the wait. The probes are part of the search's cost (its payback). FLOPs are
counted: no probe.

No test figure is read here: the trials' runs compute one (`fit` always does), the search reads
`summary.json`'s validation metric and `ledger.json`'s cost only. Confirmation on fresh seeds is
confirm.py's.
"""

from __future__ import annotations

import json
import logging
import math
import sqlite3
import statistics
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from ecotrain.base import safefile
from ecotrain.accounting.energy import cpu_time_kwh
from ecotrain.accounting.report import (figure, missing_reason, read_ledger,
                                       read_summary as report_summary)
from ecotrain.config import load_config
from ecotrain.base.errors import ConfigError, PreemptedError
from ecotrain.green import costmodel, space
from ecotrain.green.pruner import Reporter, at, gap_pruner, higher_is_better, pace  # noqa: F401 (at, pace: re-exported)
from ecotrain.base.jsonfile import RUN_FIX
from ecotrain.base.log import log
from ecotrain.base.stats import mean_ci
from ecotrain.assembly.trainer import fit
from ecotrain.base.runfiles import METRICS, SUMMARY

try:  # the `green` extra (pip install 'ecotrain[green]'); only this module imports it
    import optuna
except ImportError:  # pragma: no cover - the message is the test
    optuna = None

STUDY = "green"
EVALS = 4  # evaluations per trial, at even fractions of its schedule (what the pruner reads)
CHECK_RESERVE = 1.5  # baseline runs kept back per check seed: the baseline's run on it and the candidates
BY = {"flops": "flops", "energy": "energy", "co2e": "co2e", "cpu_seconds": "cpu_seconds", "money": "cost"}
CALIBRATE = 0.1  # a calibration probe trains this fraction of the baseline's steps (at least PROBE_MIN)
# A probe of ~1 s reads 0.65-1.76x another on a quiet machine (CPU-time energy; three searches' 82
# probes, 2026-12-07): one reading as the yardstick moved every ratio of a search by its error. So the
# reference is the median of REFERENCE_PROBES timed after the baseline, and a trial's load the median
# of the last LOAD_WINDOW probes (its own the newest): a load that changes lags two trials at most
REFERENCE_PROBES = 3
LOAD_WINDOW = 3
PROBE_MIN = 20


@dataclass
class Options:
    recipe: str
    overrides: list[str]
    out: Path
    tolerance: float = 0.01
    margin: Optional[float] = None  # the search keeps deficit <= tolerance - margin (None: half the tolerance)
    trials: int = 12
    budget_runs: float = 6.0  # the search's cost cap, in baseline runs (the baseline's own run included)
    by: str = "energy"
    seed: int = 0  # the design seed: the baseline and every trial train with it
    levers: Optional[list[str]] = None
    metric: str = "val_accuracy"
    sampler_seed: int = 0
    startup_trials: int = 4  # random trials before TPE models the history
    check_seeds: tuple = (1, 2)  # more design seeds for the cheapest feasible trials (`check`)
    check_top: int = 3  # how many of them, cheapest first, at most
    preemption: object = None
    calibrate: float = CALIBRATE  # the probes' length as a fraction of the baseline's steps; 0: no probes

    @property
    def allowed(self) -> float:
        """The deficit a trial may have on the design seed: the tolerance less a margin, since the
        cheapest of many trials that scrape the tolerance on one seed is likely to miss it on fresh ones."""
        return self.tolerance - (self.tolerance / 2 if self.margin is None else self.margin)


@dataclass
class Row:
    """One trial as the table, the HTML and the choice see it."""

    number: int
    state: str  # complete | pruned | skipped
    params: dict
    overrides: list[str]
    cost: Optional[float] = None  # the `by` figure, absolute
    ratio: Optional[float] = None  # cost / the baseline's
    flops: Optional[float] = None
    val: Optional[float] = None
    deficit: Optional[float] = None
    feasible: bool = False
    run_dir: Optional[str] = None
    why: str = ""
    check_deficit: Optional[float] = None  # mean deficit over every design seed (`check`), when checked
    check_se: Optional[float] = None  # its standard error
    load_factor: Optional[float] = None  # the recent probes over the reference probes (measured `by`; load_factor())
    predicted: Optional[float] = None  # the fitted cost model's ratio before it trained (measured `by`), when fitted


@dataclass
class Search:
    baseline: dict  # run_dir, val, cost, flops, samples
    rows: list[Row] = field(default_factory=list)
    chosen: Optional[Row] = None
    levers: list = field(default_factory=list)
    not_applied: dict = field(default_factory=dict)
    checks: list = field(default_factory=list)  # the runs of `check`: {run, cost, flops}
    probes: list = field(default_factory=list)  # the calibration probes: {run, cost, flops}
    metric: str = "val_accuracy"  # the validation metric searched on (its direction: report.lower_is_better)

    @property
    def spent_flops(self) -> float:
        return (self.baseline["flops"] + sum(r.flops or 0.0 for r in self.rows) + sum(c["flops"] for c in self.checks)
                + sum(p["flops"] for p in self.probes))

    def spent_runs(self, measured: bool) -> float:
        """What the search has spent, in baseline runs: of FLOPs for a FLOPs search; of the measured `by`
        figure for a measured one (a trial of larger batches costs what it measured, not its FLOPs), under
        the load the baseline ran in: a trial counts its load-corrected ratio and a probe its share of the
        baseline's FLOPs (it is the baseline recipe, shortened), so neither a busy machine nor one noisy
        reading of a short probe spends the budget faster."""
        if not measured:
            return self.spent_flops / self.baseline["flops"]
        base = self.baseline["cost"]
        probes = sum(p["flops"] for p in self.probes) / self.baseline["flops"] if self.baseline["flops"] else 0.0
        return (1.0 + sum(r.ratio if r.ratio is not None else (r.cost or 0.0) / base for r in self.rows) + probes
                + sum(c["cost"] for c in self.checks) / base)

    @property
    def spent(self) -> float:
        """The search's cost in the `by` figure: the baseline's run, every trial, check run and probe."""
        return (self.baseline["cost"] + sum(r.cost or 0.0 for r in self.rows) + sum(c["cost"] for c in self.checks)
                + sum(p["cost"] for p in self.probes))


def _storage_errors() -> type:
    """The database errors Optuna's storage raises (SQLAlchemy's, a dependency of Optuna)."""
    from sqlalchemy.exc import SQLAlchemyError  # with Optuna only

    return SQLAlchemyError


def need_optuna() -> None:
    if optuna is None:
        raise ConfigError("ecotrain green needs Optuna: pip install 'ecotrain[green]'")


def read_summary(run_dir: Path) -> dict:
    """A finished run's summary.json, read back checked (jsonfile.py): the figures the search reads."""
    return report_summary(run_dir, {"steps": int, "stopped_because": str})


def read_run(run_dir: Path, metric: str, by: str) -> dict:
    """The figures the search reads from a finished run: validation metric, cost, FLOPs, samples."""
    summary = read_summary(run_dir)
    if summary.get(metric) is None:
        raise ConfigError(f"--metric {metric}: not in {run_dir}/summary.json (has "
                          f"{', '.join(k for k in summary if k.startswith('val_')) or 'no val_* figure'})")
    ledger = read_ledger(run_dir)
    cost = cost_of(ledger, by)
    if cost is None:
        raise ConfigError(f"--by {by}: {run_dir}/ledger.json has no such figure ({missing_reason(ledger, BY[by])}); "
                          "use --by flops, or turn the measurement on")
    return {"run_dir": str(run_dir), "val": float(summary[metric]), "cost": float(cost),
            "flops": float(figure(ledger, "flops") or 0.0), "samples": int(ledger["samples"]),
            "stopped_because": summary.get("stopped_because"), "steps": int(summary.get("steps") or 0)}


def cost_of(ledger: dict, by: str) -> Optional[float]:
    """The `by` figure the search ranks on: energy and CO2e CPU-time based where no meter measured them
    (energy.cpu_time_kwh), the ledger's own figure otherwise."""
    if by in ("energy", "co2e"):
        kwh = cpu_time_kwh(ledger)
        if by == "energy" or kwh is None:
            return kwh
        g = (ledger.get("co2e") or {}).get("g_per_kwh")
        return None if g is None else kwh * g / 1000
    return figure(ledger, BY[by])


def probe(opts: Options, base_steps: int, name: str) -> Optional[dict]:
    """A calibration probe: the baseline recipe for `calibrate` x its steps, timed now (module doc);
    None for a counted `by` (FLOPs need no probe) or `calibrate` 0."""
    if opts.by == "flops" or opts.calibrate <= 0:
        return None
    steps = max(PROBE_MIN, round(base_steps * opts.calibrate))
    run_dir = opts.out / "probes" / name
    train(opts.recipe, [*opts.overrides, f"seed={opts.seed}", f"loop.max_steps={steps}", "loop.max_epochs=null"],
          run_dir, opts.preemption)
    ledger = read_ledger(run_dir)
    cost = cost_of(ledger, opts.by)
    if cost is None or cost <= 0:
        return None
    return {"run": str(run_dir), "cost": float(cost), "flops": float(figure(ledger, "flops") or 0.0)}


def load_factor(recent: list[float], reference: float) -> float:
    """The machine's load now against the baseline's: the median of the last LOAD_WINDOW probes' costs
    over the reference (the median of the REFERENCE_PROBES timed right after the baseline)."""
    return statistics.median(recent[-LOAD_WINDOW:]) / reference


def val_curve(run_dir: Path, metric: str) -> list[tuple[float, float]]:
    """(fraction of the schedule, validation metric) at each evaluation of a finished run."""
    steps = read_summary(run_dir)["steps"]
    points = []
    path = run_dir / METRICS
    with safefile.open_regular(path, "metrics log", fix=RUN_FIX) as f:  # a FIFO in its place: one line, no wait
        text = f.read().decode("utf-8", errors="replace")  # as long as the run wrote: no cap on a run's log
    for n, line in enumerate(text.splitlines(), start=1):
        try:
            rec = json.loads(line)
        except ValueError:  # a line cut by a kill mid-write: the curve is read from the others
            continue
        if not isinstance(rec, dict) or metric not in rec or "step" not in rec:
            continue
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (rec["step"], rec[metric])):
            raise ConfigError(f"{path}:{n}: '{metric}' or 'step' is not a number; {RUN_FIX}")
        points.append((rec["step"] / max(steps, 1), float(rec[metric])))
    return points


def check_study(path: Path) -> None:
    """The study database an earlier try left, read as SQLite before anything trains: a damaged one is
    one line here, not a database traceback after the baseline's run."""
    if not path.exists():
        return
    if not path.is_file():
        raise ConfigError(f"{path}: not a file; the search keeps its study there: move it away, or choose another "
                          "--out")
    fix = (f"move it away to start the search's record again (the runs already finished under {path.parent} "
           "are read back, not trained again), or choose another --out")
    try:
        con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            said = con.execute("PRAGMA quick_check").fetchall()
        finally:
            con.close()
    except sqlite3.Error as exc:
        raise ConfigError(f"{path}: the search's study database is damaged ({exc}); {fix}") from None
    if said != [("ok",)]:
        raise ConfigError(f"{path}: the search's study database is damaged ({str(said[0][0])[:80]}); {fix}")


def train(recipe: str, overrides: list[str], run_dir: Path, preemption, callbacks=()) -> None:
    """Train (or continue exactly, or keep) the run in `run_dir`. A stop signal checkpoints the run and
    raises PreemptedError: the search is resumed by running the same command again."""
    if (run_dir / SUMMARY).is_file():
        return  # finished by an earlier try of this search
    cfg = load_config(recipe, overrides)
    result = fit(cfg, run_dir=run_dir, resume="auto", quiet=True, callbacks=callbacks, preemption=preemption)
    if result.summary.get("stopped_because") == "preempted":
        raise PreemptedError(f"stopped at step {result.summary['steps']} of {run_dir}; run the same "
                             "`ecotrain green` command again to continue the search where it stopped")


def _sampler(opts: Options, number: int):
    # a fresh seed per trial number: a resumed process asks exactly what the killed one would have
    return optuna.samplers.TPESampler(seed=opts.sampler_seed * 1000 + number, n_startup_trials=opts.startup_trials,
                                      constraints_func=None if _set_constraint() else _constraints, multivariate=True)


def _set_constraint() -> bool:
    """Optuna >= 5 records a trial's constraints with `Trial.set_constraint` (constraints_func is deprecated)."""
    return hasattr(optuna.trial.Trial, "set_constraint")


def _constraints(trial) -> list[float]:
    return [trial.user_attrs.get("violation", 1.0)]


def run_search(opts: Options, on_trial: Callable[[Row], None] = lambda r: None) -> Search:
    need_optuna()
    check_study(opts.out / "study.db")
    opts.out.mkdir(parents=True, exist_ok=True)
    allowed = opts.allowed
    base_cfg = load_config(opts.recipe, opts.overrides)
    levers, not_applied = space.levers(base_cfg, opts.levers)
    seeded = [*opts.overrides, f"seed={opts.seed}"]

    base_dir = opts.out / "baseline"
    log.info(f"baseline: {base_dir}")
    train(opts.recipe, seeded, base_dir, opts.preemption)
    base = read_run(base_dir, opts.metric, opts.by)
    said = resolution(opts, int(((read_ledger(base_dir).get("flops") or {}).get("eval_samples_per_pass")) or 0))
    if said:
        log.warning(said)
    curve = val_curve(base_dir, opts.metric)
    search = Search(baseline=base, levers=levers, not_applied=not_applied, metric=opts.metric)
    base_steps = int(read_summary(base_dir)["steps"])
    largest = 0 if opts.by == "flops" else larger_batches(read_summary(base_dir))
    references = [got for name in ("reference", *(f"reference-{i}" for i in range(2, REFERENCE_PROBES + 1)))
                  if (got := probe(opts, base_steps, name)) is not None]  # timed right after the baseline's own run
    search.probes += references
    reference = statistics.median(p["cost"] for p in references) if len(references) == REFERENCE_PROBES else None
    recent: list[float] = []  # the trials' probes' costs, in order

    logging.getLogger("optuna").setLevel(logging.WARNING)  # one line per trial is ours
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)  # multivariate TPE
    pruner, sampler = gap_pruner(allowed), _sampler(opts, 0)
    try:
        study = optuna.create_study(study_name=STUDY, storage=f"sqlite:///{opts.out / 'study.db'}",
                                    load_if_exists=True, direction="minimize", pruner=pruner, sampler=sampler)
    except (RuntimeError, ValueError, sqlite3.Error, _storage_errors()) as exc:  # a readable SQLite file, not our study
        raise ConfigError(f"{opts.out / 'study.db'}: not a study this search can continue "
                          f"({type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}); move it "
                          "away, or choose another --out") from None
    # the trials' share of the budget, in baseline runs: the rest is the baseline's run and the check on more
    # design seeds
    budget = opts.budget_runs - CHECK_RESERVE * len(opts.check_seeds)
    measured = opts.by != "flops"
    first = space.first_trials(levers, base_cfg.data.batch_size, measured)
    number = 0
    while True:
        done = {t.number: t for t in study.get_trials(deepcopy=False)}
        trained = sum(1 for r in search.rows if r.state != "skipped")
        if number in done and done[number].state != optuna.trial.TrialState.RUNNING:
            if "stop" in done[number].user_attrs:  # where an earlier try ended the search
                break
            search.rows.append(_row_of(done[number]))  # finished by an earlier try
            if search.rows[-1].load_factor is not None:  # its probe too (read back: the run is finished), so the
                got = probe(opts, base_steps, f"p{number:03d}")  # spend and the choice are the killed try's
                if got is not None:
                    search.probes.append(got)
                    recent.append(got["cost"])
            number += 1
            continue
        if number not in done and (trained >= opts.trials or number >= 3 * opts.trials
                                   or (search.spent_runs(measured) >= budget and trained > 0)):  # one trial trains
            break
        reported: tuple = ()
        if number in done:  # left RUNNING by a killed try: continue it, same number, same values
            trial = optuna.trial.Trial(study, done[number]._trial_id)
            params, reported = space.values(done[number].params), tuple(done[number].intermediate_values)
            log.info(f"trial {number}: continuing {params}")
        else:
            study.sampler = _sampler(opts, number)
            if number < len(first):  # each lever alone first (space.first_trials); the same again after a kill
                study.enqueue_trial(first[number], skip_if_exists=True)
            trial = study.ask()
            params = space.suggest(trial, levers, base_cfg.data.batch_size, largest, measured)
        overrides = space.to_overrides(base_cfg, params, base["samples"], EVALS)
        row = Row(number, "", params, overrides)
        predicted, cheapest = predict(opts, search, params, base_cfg.data.batch_size)
        if predicted is not None and not measured and search.spent_runs(measured) + predicted > budget:
            trial.set_user_attr("stop", "budget")
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            log.info(f"trial {number}: stop: {params} would pass the budget of {opts.budget_runs:g} baseline runs")
            break
        why = skip_reason(predicted, cheapest, search.rows, measured)
        if why:
            # not trained: its cost is known (or the fitted model's cheap end is) and no lower than the best
            # feasible one's. Told to the sampler as that cost (not as a failure, which TPE ignores and would
            # propose again)
            row.state, row.why = "skipped", why
            trial.set_user_attr("skipped", row.why)
            trial.set_user_attr("violation", 0.0)
            if _set_constraint():
                trial.set_constraint("deficit", 0.0)
            study.tell(trial, predicted)
        else:
            row.predicted = predicted if opts.by != "flops" else None  # the model's guess, against what is measured
            now = probe(opts, base_steps, f"p{number:03d}") if reference is not None else None
            if now is not None:  # A, B: the baseline's probe, then the trial, under the same load
                search.probes.append(now)
                recent.append(now["cost"])
                row.load_factor = load_factor(recent, reference)
            _run_trial(opts, trial, row, base, curve, seeded, reported)
            state = optuna.trial.TrialState.PRUNED if row.state == "pruned" else None
            if state is None:
                study.tell(trial, row.ratio)
            else:
                study.tell(trial, state=state)
        search.rows.append(row)
        on_trial(row)
        number += 1
        if opts.preemption is not None and getattr(opts.preemption, "requested", None):
            raise PreemptedError(f"{opts.preemption.requested} received; trial {row.number} is recorded: run the same "
                                 "`ecotrain green` command again to continue the search")
    search.chosen = check(opts, search, base_cfg)
    return search


RESOLVE = 10  # one validation sample should move the metric by at most a tenth of the tolerance


def resolution(opts: Options, val_samples: int) -> Optional[str]:
    """One line when the validation split is too small to resolve the tolerance: an accuracy (or error)
    moves by 1/n per sample, so with n < RESOLVE / tolerance a trial passes or fails by a sample or two
    and the cheapest "feasible" trial is mostly the luckiest. None when it can, or for a metric that is
    not a fraction of samples (a loss, perplexity, bits per byte: their spread is the check seeds' to show)."""
    name = opts.metric.split("_", 1)[-1]
    if name not in ("accuracy", "error") or val_samples <= 0 or opts.tolerance <= 0:
        return None
    step = 1.0 / val_samples
    if step * RESOLVE <= opts.tolerance + 1e-12:
        return None
    need = math.ceil(RESOLVE / opts.tolerance)
    return (f"the validation split has {val_samples} samples: one sample moves {opts.metric} by {step:.4f}, more than "
            f"a tenth of the tolerance {opts.tolerance:g}, so the search cannot resolve it and its pick is mostly "
            f"luck; give data.val_split so that it holds {need} samples or more, or a larger --tolerance, or more "
            f"--check-seeds (now {len(opts.check_seeds)})")


def larger_batches(summary: dict) -> int:
    """The largest batch a measured search may try: half the training set (samples seen over epochs
    begun, which can only undercount it), 0 when the baseline's summary does not say."""
    epochs, seen = summary.get("epochs"), summary.get("samples_seen")
    if not isinstance(epochs, int) or not isinstance(seen, int) or epochs < 0 or seen < 1:
        return 0
    return seen // max(1, epochs) // 2  # a run inside its first epoch has begun one


def predict(opts: Options, search: Search, params: dict, base_batch: int) -> tuple[Optional[float], Optional[float]]:
    """(the trial's predicted cost ratio, the cheapest it can be) before it trains, or (None, None): counted
    FLOPs where the values fix them (space.predicted_cost, exact: both the same), a measured `by` from the
    fitted cost model (costmodel.py) once enough complete trials were measured."""
    if opts.by == "flops":
        known = space.predicted_cost(params)
        return known, known
    model = costmodel.fit([(r.params, r.ratio) for r in search.rows if r.state == "complete"], base_batch)
    if model is None or not model.covers(params, base_batch):  # a lever value never measured: no guess
        return None, None
    return model.predict(params, base_batch), model.cheapest(params, base_batch)


def check(opts: Options, search: Search, base_cfg) -> Optional[Row]:
    """The cheapest feasible trials, in order of cost (at most `check_top`; the first one even past the
    budget), trained again on the other design seeds beside the baseline on them: the first whose mean deficit over all design seeds, plus
    one standard error of that mean, stays within the tolerance is chosen. One seed's validation split
    is small enough that the cheapest of many trials that pass it by a hair is likely a lucky draw: the
    single seed screens with a margin (`allowed`), the mean over the design seeds decides with its own
    spread in place of the margin. Still validation only."""
    feasible = sorted((r for r in search.rows if r.feasible), key=lambda r: (r.ratio, r.deficit, r.number))
    if not opts.check_seeds:
        return feasible[0] if feasible else None
    sign = 1.0 if higher_is_better(opts.metric) else -1.0
    base_val = {}
    measured = opts.by != "flops"
    for row in feasible[:opts.check_top]:
        runs = (row.ratio or 0.0) if measured else (row.flops or 0.0) / search.baseline["flops"]  # as spent_runs
        ahead = len(opts.check_seeds) * (runs + (0.0 if base_val else 1.0))
        over = search.spent_runs(measured) + ahead > opts.budget_runs * (1 + 1e-9)
        if over and base_val:
            log.info(f"trial {row.number}: not checked: it would pass the budget of {opts.budget_runs:g} baseline runs")
            break
        if over:  # the cheapest is always checked: without it the whole search chooses nothing
            log.info(f"trial {row.number}: checked past the budget of {opts.budget_runs:g} baseline runs (the last "
                     "trial overshot the trials' share); the cheapest candidate is always checked")
        deficits = [row.deficit]
        for seed in opts.check_seeds:
            if seed not in base_val:
                run_dir = opts.out / "check" / f"baseline-s{seed}"
                train(opts.recipe, [*opts.overrides, f"seed={seed}"], run_dir, opts.preemption)
                got = read_run(run_dir, opts.metric, opts.by)
                base_val[seed] = got["val"]
                search.checks.append({"run": str(run_dir), "cost": got["cost"], "flops": got["flops"]})
            run_dir = opts.out / "check" / f"t{row.number:03d}-s{seed}"
            train(opts.recipe, [*opts.overrides, f"seed={seed}", *row.overrides], run_dir, opts.preemption)
            got = read_run(run_dir, opts.metric, opts.by)
            search.checks.append({"run": str(run_dir), "cost": got["cost"], "flops": got["flops"]})
            deficits.append(sign * (base_val[seed] - got["val"]))
        iv = mean_ci(deficits)
        row.check_deficit = iv.mean
        row.check_se = statistics.stdev(deficits) / math.sqrt(len(deficits))
        log.info(f"trial {row.number}: validation deficit over design seeds "
                 f"{','.join(str(s) for s in (opts.seed, *opts.check_seeds))}: {iv.mean:+.4f} "
                 f"(standard error {row.check_se:.4f}; per seed {', '.join(f'{d:+.4f}' for d in deficits)})")
        if row.check_deficit + row.check_se <= opts.tolerance + 1e-12:
            return row
    return None


def skip_reason(predicted: Optional[float], cheapest: Optional[float], rows, measured: bool) -> Optional[str]:
    """Why a trial is not trained, or None: its known cost (or the fitted model's cheap end) is no lower
    than the cheapest feasible trial's. Measured, the baseline itself is a feasible recipe at 1x (a
    counted trial never costs more than it), so a trial that cannot be cheaper is never the answer."""
    best = min([r.ratio for r in rows if r.feasible] + ([1.0] if measured else []), default=None)
    if cheapest is None or best is None or cheapest < best:
        return None
    than = "the baseline" if best >= 1.0 else f"the best feasible {best:.3f}x"
    model = "" if cheapest == predicted else f" (the fitted cost model's cheap end: {cheapest:.3f}x)"
    return f"predicted {predicted:.3f}x, no cheaper than {than}{model}"


def _run_trial(opts: Options, trial, row: Row, base: dict, curve, seeded: list[str], reported=()) -> None:
    run_dir = opts.out / "trials" / f"t{row.number:03d}"
    trial.set_user_attr("overrides", row.overrides)
    trial.set_user_attr("run_dir", str(run_dir))
    if row.params.get("fidelity"):  # half-size inputs until then: an evaluation at full size before it is no reading
        trial.set_user_attr("prune_from", math.floor(100 * row.params["fidelity"]) + 1)
    reporter = Reporter(trial, curve, opts.metric, reported, base_steps=base["steps"])
    train(opts.recipe, [*seeded, *row.overrides], run_dir, opts.preemption, [reporter])
    got = read_run(run_dir, opts.metric, opts.by)
    sign = 1.0 if higher_is_better(opts.metric) else -1.0
    row.run_dir, row.cost, row.flops, row.val = str(run_dir), got["cost"], got["flops"], got["val"]
    row.ratio = got["cost"] / (base["cost"] * (row.load_factor or 1.0))  # the baseline's cost under this load
    row.deficit = sign * (base["val"] - got["val"])
    pruned = got["stopped_because"] == "pruned"
    row.state = "pruned" if pruned else "complete"
    row.feasible = not pruned and row.deficit <= opts.allowed + 1e-12
    for k, v in {"cost": row.cost, "ratio": row.ratio, "flops": row.flops, "val": row.val, "deficit": row.deficit,
                 "violation": row.deficit - opts.allowed, "pruned": pruned, "load_factor": row.load_factor,
                 "predicted": row.predicted}.items():
        trial.set_user_attr(k, v)
    if _set_constraint():
        trial.set_constraint("deficit", row.deficit - opts.allowed)


def _row_of(t) -> Row:
    """A trial an earlier try finished, from the study's record."""
    a = t.user_attrs
    state = "skipped" if "skipped" in a else "pruned" if a.get("pruned") else "complete"
    return Row(t.number, state, space.values(t.params), list(a.get("overrides", [])), a.get("cost"), a.get("ratio"),
               a.get("flops"), a.get("val"), a.get("deficit"),
               feasible=state == "complete" and a.get("violation", 1.0) <= 1e-12, run_dir=a.get("run_dir"),
               why=a.get("skipped", ""), load_factor=a.get("load_factor"), predicted=a.get("predicted"))
