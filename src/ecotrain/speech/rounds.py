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

from ecotrain.errors import ConfigError
from ecotrain.log import log
from ecotrain.rundir import write_json
from ecotrain.speech import checks
from ecotrain.speech.ctc import transcribe, word_error_rate
from ecotrain.speech.dataset import SpeechData
from ecotrain.speech.feedback import (ADAPTER_TARGETS, FeedbackSettings, Replay, Trainer, cross_fit_check,
                                      label_accounting, make_incoming)
from ecotrain.speech.labels import decode
from ecotrain.speech.router import SpeechRouter


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


def run(cfg, data: SpeechData, s: FeedbackSettings, out: Path, quiet: bool = True) -> dict:
    from ecotrain.continual.drift import drift_report
    from ecotrain.continual.gate import GatePolicy, decide
    from ecotrain.continual.registry import Registry

    out = Path(out)
    seed = cfg.seed
    have = sorted({r["cohort"] for r in data.rows})
    for c in [s.base_cohort, *s.rounds]:
        if c not in have:
            raise ConfigError(f"data.kwargs.feedback: cohort '{c}' is not in the data (cohorts: {', '.join(have)})")
    trainer = Trainer(cfg, out, quiet)
    policy = GatePolicy(tolerance=s.tolerance)
    cut = {c: gate_and_report(data.source(data.select(cohort=c, split="test"))) for c in [s.base_cohort, *s.rounds]}
    holdout_gate, holdout = {s.base_cohort: cut[s.base_cohort][0]}, {s.base_cohort: cut[s.base_cohort][1]}
    new_gate, new_test = ({c: cut[c][k] for c in s.rounds} for k in (0, 1))

    base_idx = data.select(cohort=s.base_cohort, split="train")
    base_model, base_dir = trainer.fit("base", data.source(base_idx), s.base_steps)
    base_path = base_dir / "model.safetensors"
    regs = {k: Registry(out / f"registry-{k}") for k in s.strategies}
    base_wer = {"old": wer({}, base_model, holdout), "new": wer({}, base_model, new_test)}
    base_gate_old = wer({}, base_model, holdout_gate)  # the gate's own baseline, on its own half
    for reg in regs.values():
        _commit(reg, _weights(base_model), {"parent": None, "cohort": s.base_cohort, "wer": base_wer}, {}, True,
                "base version")
    log.info("base: WER original voices %.3f, new voices %.3f", base_wer["old"], base_wer["new"])
    rows = [{"round": 0, "strategy": "base", "old_wer": base_wer["old"], "new_wer": base_wer["new"],
             "promoted": True, "note": "trained on the original voices"}]

    replay = Replay(s.replay_size, seed)
    replay.add(data, base_idx, [data.rows[i]["transcript"].split() for i in base_idx])
    current = {k: (base_model, base_path) for k in ("naive", "protected")}
    adapters: dict = {}  # cohort -> adapted model (routing)
    router = SpeechRouter(seed=seed)  # picks the adapter from the audio when the request has no cohort
    router.add(data.source(base_idx), s.base_cohort)
    newest = None  # the newest promoted adapter model: the "no routing" row serves it to everyone
    rounds = []
    for r, cohort in enumerate(s.rounds, 1):
        inc = make_incoming(data, cohort, s, seed + r)
        recent = {cohort: new_gate[cohort]}
        cur_model, cur_path = current["protected"]
        n_usable = sum(w is not None for w in inc.words)
        rep_n = round(n_usable * s.replay_ratio / (1 - s.replay_ratio))
        check = {"review": []}
        if "protected" in s.strategies or "adapters" in s.strategies:
            check = cross_fit_check(trainer, data, inc, cur_path, replay.sample(data, rep_n, seed + r), s, seed + r)
            write_json(out / f"review-round{r}.json", check["review"])
        labels = label_accounting(inc)
        ref_p = checks.frame_posteriors(cur_model, holdout_gate[s.base_cohort])
        new_p = checks.frame_posteriors(cur_model, data.source(inc.idx))
        drift = drift_report(ref_p, None, new_p, None, None)
        for line in drift["alerts"]:
            log.info("round %d (%s): %s", r, cohort, line)
        kept = inc.kept()
        clean = data.source([inc.idx[j] for j in kept], [inc.words[j] for j in kept])
        usable = [j for j, w in enumerate(inc.words) if w is not None]
        rec = {"round": r, "cohort": cohort, "labels": labels, "drift": drift, "strategies": {}}

        def gate(old_models, old_default, new_models, new_default):
            # the holdout against the base version, not the current one: the tolerance is a budget for
            # all rounds together, so small losses cannot add up round after round
            before = {"holdout": 1 - base_gate_old, "recent": 1 - wer(old_models, old_default, recent)}
            after = {"holdout": 1 - wer(new_models, new_default, holdout_gate),
                     "recent": 1 - wer(new_models, new_default, recent)}
            return decide(before, after, ["holdout"], "recent", policy)

        if "naive" in s.strategies:
            prev, prev_path = current["naive"]
            m, rd = trainer.fit(f"naive-r{r}", data.source([inc.idx[j] for j in usable],
                                                          [inc.words[j] for j in usable]), s.update_steps, prev_path,
                                lr=s.update_lr)
            ok, reason = gate({}, prev, {}, m)
            _commit(regs["naive"], _weights(m), {"parent": str(prev_path), "cohort": cohort}, {}, True,
                    f"deployed without a gate (the gate would say: {reason})")
            current["naive"] = (m, rd / "model.safetensors")
            rec["strategies"]["naive"] = _row(r, "naive", wer({}, m, holdout), wer({}, m, new_test), ok, reason, 0)

        if "protected" in s.strategies:
            lwf = {"name": "lwf", "teacher": str(cur_path), "alpha": s.lwf_alpha, "temperature": s.lwf_temperature}
            train_src = clean + replay.sample(data, round(len(clean) * s.replay_ratio / (1 - s.replay_ratio)), seed + 100 + r)
            m, rd = trainer.fit(f"protected-r{r}", train_src, s.update_steps, cur_path, [lwf], s.update_lr)
            ok, reason = gate({}, cur_model, {}, m)
            _commit(regs["protected"], _weights(m), {"parent": str(cur_path), "cohort": cohort, "labels": labels,
                                                     "drift_alerts": drift["alerts"]}, {}, ok, reason)
            caught = labels["wrong_caught"] if ok else labels["wrong"]  # a rejected round deploys none of them
            if ok:
                current["protected"] = (m, rd / "model.safetensors")
                replay.add(data, [inc.idx[j] for j in kept], [inc.words[j] for j in kept])
            shown = current["protected"][0]
            rec["strategies"]["protected"] = _row(r, "protected", wer({}, shown, holdout), wer({}, shown, new_test),
                                                  ok, reason, caught)

        if "adapters" in s.strategies:
            spec = {"name": "adapters", "target_modules": ADAPTER_TARGETS, "r": s.adapter_rank,
                    "alpha": 2.0 * s.adapter_rank}
            m, rd = trainer.fit(f"adapter-{cohort}", clean, s.update_steps, base_path, [spec])  # new LoRA: the base LR
            ok, reason = gate(adapters, base_model, {**adapters, cohort: m}, base_model)
            files = {f"adapter/{f.name}": f for f in sorted((rd / "adapter").iterdir())}
            _commit(regs["adapters"], None, {"parent": "v0001", "cohort": cohort, "weights": "adapter"}, files, ok,
                    reason, make_current=False)
            if ok:
                adapters[cohort], newest = m, m
                router.add(clean, cohort)
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
    results = {"base": base_wer, "rows": rows, "rounds": rounds, "settings": s.__dict__, "seed": seed,
               "gate_split_disjoint": _disjoint(cut)}
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


__all__ = ["run", "table", "summary_figures"]
