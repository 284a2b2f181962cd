"""The feedback experiment end to end: base version, rounds, evaluation, registry, results.json.

Every cohort's test utterances are cut in two halves (`gate_and_report`): the promotion gate reads
one, the reported WERs the other. The adapters strategy is reported three ways: routed by the cohort
the request carries (metadata), routed by a learned router from the audio (router.py), and with no
routing (the newest promoted adapter model serves everyone).

`run(cfg, data, settings, out)` returns the results dict that `ecotrain speech-feedback` prints as
a table and bench/speech_feedback.py turns into its RESULT line. Layout of `out`: runs/ (every
`fit` run folder), registry-<strategy>/ (ecotrain's model registry), review-round<N>.json (the
flagged transcripts, for human review), results.json.
"""

from __future__ import annotations

from pathlib import Path

from ecotrain.continual.drift import drift_report
from ecotrain.continual.gate import GatePolicy, decide
from ecotrain.continual.registry import Registry
from ecotrain.continual.router import accuracy as route_accuracy
from ecotrain.base.errors import ConfigError
from ecotrain.base.tensorfile import save_weights
from ecotrain.base.log import log
from ecotrain.methods.average import averaged_model
from ecotrain.base.rundir import write_json
from ecotrain.speech import checks
from ecotrain.speech.ctc import transcribe, word_error_rate
from ecotrain.speech.dataset import SpeechData
from ecotrain.assembly.speech_feedback import (ADAPTER_TARGETS, FeedbackSettings, Replay, Trainer, cross_fit_check,
                                      label_accounting, make_incoming)
from ecotrain.speech.transcripts import decode
from ecotrain.speech.utterance_router import SpeechRouter
from ecotrain.base.runfiles import RunFiles


def wer(models: dict, default, sources: dict) -> float:
    """Corpus WER over several cohorts' sources, each read by the model of the cohort the request
    carries (metadata routing: the product knows a request's cohort); `default` for the others."""
    hyps, refs = [], []
    for cohort, src in sources.items():
        hyps += [decode(h) for h in transcribe(models.get(cohort, default), src)]
        refs += [decode(lab) for lab in src.label_ids]
    return word_error_rate(hyps, refs)


def wer_routed(router, models: dict, default, sources: dict) -> float:
    """Corpus WER with each utterance's model picked by the learned router from its audio alone."""
    hyps, refs = [], []
    for src in sources.values():
        routes = router.route(src)
        for route in set(routes):
            idx = [i for i, r in enumerate(routes) if r == route]
            part = src.subset(idx)
            hyps += [decode(h) for h in transcribe(models.get(route, default) if route else default, part)]
            refs += [decode(lab) for lab in part.label_ids]
    return word_error_rate(hyps, refs)


def gate_and_report(source):
    """A cohort's test utterances cut in two disjoint halves: the gate decides on one (every other
    utterance, by id order), the reported WERs are measured on the other, never seen by a decision."""
    n = len(source)
    return source.subset(list(range(0, n, 2))), source.subset(list(range(1, n, 2)))


def _weights(model) -> dict:
    return {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}


def _commit(reg, weights, meta: dict, files: dict, promoted: bool, reason: str, make_current: bool = True) -> str:
    def settle(idx, name):
        if promoted and make_current:
            reg.make_current(idx, name, reason)
        else:
            reg.set_status(idx, name, "promoted" if promoted else "rejected", reason)
    return reg.commit(weights, meta, files, [], settle)


class Served:
    """What serves each strategy now: one model for everyone, or (adapters) the base plus one adapter
    model per cohort, routed by the request's cohort or by the learned router."""

    def __init__(self, model, path):
        self.model, self.path = model, path

    def wer(self, sources: dict) -> float:
        return wer({}, self.model, sources)


def run(cfg, data: SpeechData, s: FeedbackSettings, out: Path, quiet: bool = True) -> dict:
    out = Path(out)
    seed = cfg.seed
    have = sorted({r["cohort"] for r in data.rows})
    for c in [s.base_cohort, *s.rounds]:
        if c not in have:
            raise ConfigError(f"data.kwargs.feedback: cohort '{c}' is not in the data (cohorts: {', '.join(have)})")
    trainer = Trainer(cfg, out, quiet)
    cap = s.cap if s.cap is not None else s.tolerance
    policy = GatePolicy(tolerance=s.tolerance, cap=cap)
    cohorts = list(dict.fromkeys(s.rounds))
    cut = {c: gate_and_report(data.source(data.select(cohort=c, split="test"))) for c in [s.base_cohort, *cohorts]}
    gate_half, report_half = ({c: cut[c][k] for c in cut} for k in (0, 1))
    holdout = {s.base_cohort: report_half[s.base_cohort]}
    new_test = {c: report_half[c] for c in cohorts}

    base_idx = data.select(cohort=s.base_cohort, split="train")
    base_model, base_dir = trainer.fit("base", data.source(base_idx), s.base_steps)
    base_path = RunFiles(base_dir).model
    regs = {k: Registry(out / f"registry-{k}") for k in s.strategies}
    base_wer = {"old": wer({}, base_model, holdout), "new": wer({}, base_model, new_test),
                "all": wer({}, base_model, report_half)}
    base_gate_old = wer({}, base_model, {s.base_cohort: gate_half[s.base_cohort]})  # the budget's baseline
    for reg in regs.values():
        _commit(reg, _weights(base_model), {"parent": None, "wer": base_wer}, {}, True, "base version")
    log.info("base: WER original voices %.3f, new voices %.3f", base_wer["old"], base_wer["new"])
    rows = [{"round": 0, "strategy": "base", "old_wer": base_wer["old"], "new_wer": base_wer["new"],
             "promoted": True, "note": "trained on the original voices"}]

    replay = Replay(s.replay_size, seed)
    replay.add(data, base_idx, [data.rows[i]["transcript"].split() for i in base_idx])
    current = {k: Served(base_model, base_path) for k in ("naive", "replay", "protected", "average")}
    adapters: dict = {}  # cohort -> its adapted model (routing)
    adapter_dirs: dict = {}  # cohort -> the run folder of its promoted adapter
    router = SpeechRouter(base_model, seed=seed)  # picks the adapter when the request has no cohort
    router.add(data.source(base_idx), s.base_cohort)
    newest = None  # the newest promoted adapter model: the "no routing" row serves it to everyone
    seen_clean: list[tuple[int, list[str]]] = []  # every kept feedback utterance: the joint run's data
    rejections: list[dict] = []
    rounds = []
    for r, cohort in enumerate(s.rounds, 1):
        part, parts = s.rounds[:r - 1].count(cohort), s.rounds.count(cohort)
        inc = make_incoming(data, cohort, s, seed + r, part, parts)
        old = [s.base_cohort] + [c for c in dict.fromkeys(s.rounds[:r - 1]) if c != cohort]
        n_usable = sum(w is not None for w in inc.words)
        rep_n = round(n_usable * s.replay_ratio / (1 - s.replay_ratio))
        cur_model, cur_path = current["protected"].model, current["protected"].path
        check = {"review": []}
        if {"replay", "protected", "average", "adapters"} & set(s.strategies):
            check = cross_fit_check(trainer, data, inc, cur_path, replay.sample(data, rep_n, seed + r), s, seed + r)
            write_json(out / f"review-round{r}.json", check["review"])
        labels = label_accounting(inc)
        ref_p = checks.frame_posteriors(cur_model, gate_half[s.base_cohort])
        new_p = checks.frame_posteriors(cur_model, data.source(inc.idx))
        drift = drift_report(ref_p, None, new_p, None, None)
        for line in drift["alerts"]:
            log.info("round %d (%s): %s", r, cohort, line)
        kept = inc.kept()
        clean = data.source([inc.idx[j] for j in kept], [inc.words[j] for j in kept])
        seen_clean += [(inc.idx[j], inc.words[j]) for j in kept]
        usable = [j for j, w in enumerate(inc.words) if w is not None]
        rec = {"round": r, "cohort": cohort, "labels": labels, "drift": drift, "strategies": {}}

        def gate(name, before_wer, after_wer, recent_before=None, recent_after=None):
            """Word accuracy (1 - WER) on the gate halves: the original voices against the base (a budget
            for all rounds), each other old cohort capped per round, the round's cohort must improve
            (read by `recent_*` when the feedback's own requests are served otherwise: their cohort)."""
            before = {c: 1 - before_wer({c: gate_half[c]}) for c in old[1:]}
            before.update({s.base_cohort: 1 - base_gate_old,
                           "recent": 1 - (recent_before or before_wer)({cohort: gate_half[cohort]})})
            after = {c: 1 - after_wer({c: gate_half[c]}) for c in old}
            after["recent"] = 1 - (recent_after or after_wer)({cohort: gate_half[cohort]})
            ok, reason = decide(before, after, old, "recent", policy)
            fig = {"round": r, "strategy": name, "promote": ok, "reason": reason, "before": before, "after": after,
                   "cap": cap}
            if not ok:
                rejections.append(fig)
            return ok, reason, fig

        def single(name, m, rd, parent):
            """Gate, register and (if promoted) deploy a one-model version of strategy `name`."""
            dep = current[name]
            ok, reason, fig = gate(name, dep.wer, lambda src: wer({}, m, src))
            _commit(regs[name], _weights(m), {"parent": str(parent), "feedback_from": cohort, "labels": labels,
                                              "metrics": {"gate": fig}}, {}, ok, reason)
            if ok:
                current[name] = Served(m, RunFiles(rd).model if rd is not None else None)
            shown = current[name].model
            caught = labels["wrong_caught"] if ok else labels["wrong"]  # a rejected round deploys none of them
            rec["strategies"][name] = _row(r, name, wer({}, shown, holdout), wer({}, shown, new_test), ok, reason,
                                           caught)
            return ok

        if "naive" in s.strategies:
            prev = current["naive"]
            m, rd = trainer.fit(f"naive-r{r}", data.source([inc.idx[j] for j in usable],
                                                          [inc.words[j] for j in usable]), s.update_steps, prev.path,
                                lr=s.update_lr)
            ok, reason, _ = gate("naive", prev.wer, lambda src: wer({}, m, src))
            _commit(regs["naive"], _weights(m), {"parent": str(prev.path), "feedback_from": cohort}, {}, True,
                    f"deployed without a gate (the gate would say: {reason})")
            current["naive"] = Served(m, RunFiles(rd).model)
            rejections[:] = [f for f in rejections if f["strategy"] != "naive"]  # naive deploys regardless
            rec["strategies"]["naive"] = _row(r, "naive", wer({}, m, holdout), wer({}, m, new_test), ok, reason, 0)

        mix = (lambda seed_: clean + replay.sample(data, round(len(clean) * s.replay_ratio / (1 - s.replay_ratio)),
                                                   seed_))
        if "replay" in s.strategies:
            prev = current["replay"]
            m, rd = trainer.fit(f"replay-r{r}", mix(seed + 200 + r), s.update_steps, prev.path, lr=s.update_lr)
            single("replay", m, rd, prev.path)

        if "protected" in s.strategies:
            prev = current["protected"]
            lwf = {"name": "lwf", "teacher": str(prev.path), "alpha": s.lwf_alpha, "temperature": s.lwf_temperature}
            m, rd = trainer.fit(f"protected-r{r}", mix(seed + 100 + r), s.update_steps, prev.path, [lwf], s.update_lr)
            if single("protected", m, rd, prev.path):
                replay.add(data, [inc.idx[j] for j in kept], [inc.words[j] for j in kept])

        if "average" in s.strategies:
            prev = current["average"]
            ft, _ = trainer.fit(f"average-r{r}", clean, s.update_steps, prev.path, lr=s.update_lr)
            # alpha chosen on the gate split: the largest (most of the new model) the gate accepts
            for alpha in sorted(s.average_alphas, reverse=True):
                m = averaged_model(ft, prev.model, alpha, "speech average")
                ok, _, _ = gate("average-try", prev.wer, lambda src: wer({}, m, src))
                rejections[:] = [f for f in rejections if f["strategy"] != "average-try"]
                if ok:
                    break
            rd = out / "runs" / f"average-r{r}-alpha"
            rd.mkdir(parents=True, exist_ok=True)
            save_weights(RunFiles(rd).model, m)
            single("average", m, rd, prev.path)
            rec["strategies"]["average"]["alpha"] = alpha

        if "adapters" in s.strategies:
            spec = {"name": "adapters", "target_modules": ADAPTER_TARGETS, "r": s.adapter_rank,
                    "alpha": 2.0 * s.adapter_rank}
            if cohort in adapter_dirs:  # the cohort is back: its adapter goes on from where it was
                spec["from"] = str(adapter_dirs[cohort] / "adapter")
            m, rd = trainer.fit(f"adapter-{cohort}-r{r}", clean, s.update_steps, base_path, [spec])  # the base LR
            trial = router.copy()
            trial.add(clean, cohort)
            # old voices with no cohort given (the router decides: where a new adapter can reach them); the
            # round's cohort as its requests arrive, carrying their cohort
            ok, reason, fig = gate("adapters", lambda src: wer_routed(router, adapters, base_model, src),
                                   lambda src: wer_routed(trial, {**adapters, cohort: m}, base_model, src),
                                   lambda src: wer(adapters, base_model, src),
                                   lambda src: wer({**adapters, cohort: m}, base_model, src))
            files = {f"adapter/{f.name}": f for f in sorted((rd / "adapter").iterdir())}
            _commit(regs["adapters"], None, {"parent": "v0001", "cohort": cohort, "weights": "adapter",
                                             "metrics": {"gate": fig}}, files, ok, reason, make_current=True)
            if ok:
                adapters[cohort], newest, router, adapter_dirs[cohort] = m, m, trial, rd
            row = _row(r, "adapters", wer(adapters, base_model, holdout), wer(adapters, base_model, new_test), ok,
                       reason, labels["wrong_caught"] if ok else labels["wrong"])
            merged = newest or base_model
            row.update(old_wer_router=wer_routed(router, adapters, base_model, holdout),
                       new_wer_router=wer_routed(router, adapters, base_model, new_test),
                       old_wer_merged=wer({}, merged, holdout), new_wer_merged=wer({}, merged, new_test))
            rec["strategies"]["adapters"] = row
        rows += list(rec["strategies"].values())
        log.info("round %d (%s): labels %s", r, cohort, labels)
        rounds.append(rec)
        for k, v in rec["strategies"].items():
            log.info("round %d (%s) %s: old %.3f new %.3f; %s", r, cohort, k, v["old_wer"], v["new_wer"], v["note"])

    # the final state of every way of serving, on both halves: the gate half chooses, the report half reports
    final = {k: (lambda src, m=current[k].model: wer({}, m, src)) for k in current if k in s.strategies}
    if "adapters" in s.strategies:
        final["adapters_routed"] = lambda src: wer(adapters, base_model, src)
        final["adapters_router"] = lambda src: wer_routed(router, adapters, base_model, src)
        final["merged"] = lambda src, m=newest or base_model: wer({}, m, src)
    if s.joint:  # the upper bound: one run from the base on every utterance kept, base voices included
        items = [(i, data.rows[i]["transcript"].split()) for i in base_idx] + seen_clean
        jm, _ = trainer.fit("joint", data.source([i for i, _ in items], [w for _, w in items]),
                            s.update_steps * len(s.rounds), base_path, lr=s.update_lr)
        final["joint"] = lambda src: wer({}, jm, src)
    final_wer = {k: {"gate_all": f(gate_half), "all": f(report_half), "old": f(holdout), "new": f(new_test)}
                 for k, f in final.items()}
    truth, routes = [], []
    for c, src in report_half.items():
        want = c if c in adapters else s.base_cohort  # a cohort with no adapter is the base model's to read
        truth += [want] * len(src)
        routes += router.route(src)
    results = {"base": base_wer, "rows": rows, "rounds": rounds, "settings": s.__dict__, "seed": seed,
               "gate_split_disjoint": _disjoint(cut), "final": final_wer, "rejections": rejections,
               "router_accuracy": route_accuracy(routes, truth, s.base_cohort),
               "replay_fraction": s.replay_size / len(base_idx), "cap": cap}
    write_json(out / "results.json", results)
    return results


def _disjoint(cut: dict) -> bool:
    """No utterance is in both a gate half and a report half (by its features' identity)."""
    gate_ids = {id(seg) for g, _ in cut.values() for seg in g.segs}
    return not any(id(seg) in gate_ids for _, rep in cut.values() for seg in rep.segs)


def _row(r, strategy, old, new, promoted, reason, caught) -> dict:
    return {"round": r, "strategy": strategy, "old_wer": old, "new_wer": new, "promoted": bool(promoted),
            "note": reason, "bad_caught": caught}


def table(results: dict) -> str:
    lines = ["| round | strategy | WER original voices | WER new voices | gate |", "|---|---|---|---|---|"]
    for row in results["rows"]:
        verdict = "base" if row["round"] == 0 else ("promoted" if row["promoted"] else "rejected")
        if row["strategy"] == "naive" and row["round"]:
            verdict = f"deployed (gate: {'yes' if row['promoted'] else 'no'})"
        lines.append(f"| {row['round']} | {row['strategy']} | {row['old_wer']:.3f} | {row['new_wer']:.3f} | {verdict} |")
    return "\n".join(lines)


def summary_figures(results: dict, strategy: str = "protected") -> dict:
    """For `strategy`, after the last round: old_wer_rise (final - base WER on the original voices,
    absolute), new_wer_cut (the new voices' WER cut, as a share of the base's), bad transcripts
    caught by the checks or a rejecting gate, and by the checks alone."""
    rows = [r for r in results["rows"] if r["strategy"] == strategy]
    if not rows:
        return {}
    final, base = rows[-1], results["base"]
    by_checks = sum(rec["labels"]["wrong_caught"] for rec in results["rounds"])

    def cut(new):
        return (base["new"] - new) / base["new"] if base["new"] else 0.0
    out = {"old_wer_rise": final["old_wer"] - base["old"], "new_wer_cut": cut(final["new_wer"]),
           "bad_caught": sum(r["bad_caught"] for r in rows), "bad_by_checks": by_checks,
           "bad_total": sum(rec["labels"]["wrong"] for rec in results["rounds"])}
    for how in ("router", "merged"):  # the adapters' other two ways of serving (rounds.run)
        if f"old_wer_{how}" in final:
            out[f"old_wer_rise_{how}"] = final[f"old_wer_{how}"] - base["old"]
            out[f"new_wer_cut_{how}"] = cut(final[f"new_wer_{how}"])
    return out


NO_COHORT = ("naive", "replay", "protected", "average", "adapters_router", "merged")  # serve without metadata
REPLAYS = ("replay", "protected")  # the ways that keep utterances of the past


def final_figures(results: dict) -> dict:
    """Per way of serving after the last round: WER over every gate half (`gate_all`, what a choice may
    read), and on the report halves the original voices' WER rise, the new voices' WER cut (share of
    the base's) and the WER over all voices; `gap_closed` against fine-tuning (naive) and joint training."""
    base, fin = results["base"], results["final"]
    out = {}
    for k, f in fin.items():
        out[k] = {"gate_all": f["gate_all"], "all": f["all"], "old_wer_rise": f["old"] - base["old"],
                  "new_wer_cut": (base["new"] - f["new"]) / base["new"] if base["new"] else 0.0}
        if "naive" in fin and "joint" in fin:
            gap = fin["naive"]["all"] - fin["joint"]["all"]
            out[k]["gap_closed"] = (fin["naive"]["all"] - f["all"]) / gap if gap else float("nan")
    return out


def rejections_correct(results: dict) -> tuple[int, int]:
    """(rejections whose own gate figures break a rule, rejections): re-read from the recorded figures,
    every rejected version lost more than the cap on an old cohort (or the base budget) or did not improve."""
    ok = 0
    for f in results["rejections"]:
        b, a = f["before"], f["after"]
        old = [k for k in a if k != "recent"]
        broke = any(b[k] - a[k] > f["cap"] + 1e-12 for k in old)
        avg = sum(b[k] - a[k] for k in old) / len(old) > results["settings"]["tolerance"] + 1e-12
        ok += broke or avg or a["recent"] - b["recent"] <= 1e-12
    return ok, len(results["rejections"])


__all__ = ["run", "table", "summary_figures", "final_figures", "rejections_correct"]
