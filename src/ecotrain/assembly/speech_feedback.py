"""Feedback rounds for the speech model: a base version, then rounds of user feedback from new
voices, each normalised, checked, trained with a strategy, gated, and promoted or rejected.

Strategies (`STRATEGIES`):
- `naive`: fine-tune the deployed model on the feedback as it comes (normalised only so it can be
  tokenised); always deployed, the gate's verdict is reported for contrast.
- `replay`: label checks, then replay alone (the buffer mixed into the round's data), then the gate.
- `average`: label checks, fine-tune the deployed model on the round's data, then average it with the
  deployed one (methods/average.py, Vander Eeckt & Van hamme): the largest alpha in
  `average_alphas` the gate accepts on its split (no data of the past kept at all).
- `protected`: label checks, then replay (a cohort-balanced buffer of past utterances mixed into
  the round's data) + LwF (methods.lwf: distillation from the current version), then the gate;
  promoted or kept as a rejected candidate in the registry.
- `adapters`: label checks, then one LoRA adapter per cohort (methods.adapters, PEFT) on the frozen
  base, routed by the cohort key at inference; the original voices keep the base model.

The label checks are cross-fitted: the round's feedback is cut in two, a checker trained on one
half (from the current version, with replay) scores the other (checks.py), so a transcript is
never judged by a model that learnt it. Training goes through `ecotrain.fit` (checkpoints, the
ledger and resume as for any run); versions go into `ecotrain.continual.registry`, the verdict
comes from `ecotrain.continual.gate.decide` on word accuracy (1 - WER), drift from
`ecotrain.continual.drift.drift_report` on frame posteriors.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch

from ecotrain.config import Config
from ecotrain.base.errors import ConfigError, PreemptedError
from ecotrain.methods.replay import balanced
from ecotrain.speech import checks
from ecotrain.speech.ctc import CTCTask
from ecotrain.speech.dataset import SpeechData, SpeechSource, bundle
from ecotrain.speech.transcripts import corrupt, decode, normalize_transcript
from ecotrain.assembly.trainer import fit

STRATEGIES = ("naive", "replay", "protected", "average", "adapters")
ADAPTER_TARGETS = ["conv.0", "conv.2", "proj", "head"]  # Conv1d and Linear: what PEFT's LoRA supports


@dataclass
class FeedbackSettings:
    """`data.kwargs.feedback` of recipes/speech_feedback.yaml."""

    rounds: list[str] = field(default_factory=lambda: ["accent_de", "accent_es", "fast_noisy"])
    base_cohort: str = "base"
    wrong_fraction: float = 0.2  # transcripts replaced by another digit sequence
    format_fraction: float = 0.3  # right words, typed inconsistently ("7", "Seven.", "SEVEN, 3")
    base_steps: int = 300
    update_steps: int = 80
    update_lr: float = 0.0005  # below the base's: a round nudges the model, it does not retrain it
    check_steps: int = 80
    contradiction_threshold: float = 3.0  # nats per word (checks.py)
    replay_size: int = 160  # utterances kept, cohort-balanced
    replay_ratio: float = 0.7  # replayed utterances' share of a round's training rows
    lwf_alpha: float = 2.0
    lwf_temperature: float = 2.0
    adapter_rank: int = 8
    tolerance: float = 0.02  # WER points the original voices may lose over all rounds (against the base)
    cap: Optional[float] = None  # kappa: WER points any one old cohort may lose in a round (default: tolerance)
    average_alphas: list[float] = field(default_factory=lambda: [0.25, 0.5, 0.75, 1.0])
    joint: bool = True  # also train once on everything (the upper bound `gap_closed` is measured against)
    strategies: list[str] = field(default_factory=lambda: list(STRATEGIES))

    @staticmethod
    def parse(d: Optional[dict]) -> "FeedbackSettings":
        d = dict(d or {})
        known = FeedbackSettings.__dataclass_fields__
        bad = [k for k in d if k not in known]
        if bad:
            raise ConfigError(f"data.kwargs.feedback.{bad[0]}: not a feedback setting ({', '.join(known)})")
        s = FeedbackSettings(**d)
        for k in ("wrong_fraction", "format_fraction"):
            if not 0 <= getattr(s, k) <= 1:
                raise ConfigError(f"data.kwargs.feedback.{k}: must be between 0 and 1 (got {getattr(s, k)})")
        if s.wrong_fraction + s.format_fraction > 1:
            raise ConfigError("data.kwargs.feedback: wrong_fraction + format_fraction must be at most 1")
        if not 0 < s.replay_ratio < 1:
            raise ConfigError(f"data.kwargs.feedback.replay_ratio: must be in (0, 1) (got {s.replay_ratio})")
        unknown = [x for x in s.strategies if x not in STRATEGIES]
        if unknown:
            raise ConfigError(f"data.kwargs.feedback.strategies: '{unknown[0]}' is not one of {', '.join(STRATEGIES)}")
        for k in ("base_steps", "update_steps", "check_steps", "replay_size"):
            if int(getattr(s, k)) < 1:
                raise ConfigError(f"data.kwargs.feedback.{k}: must be at least 1")
        if not s.average_alphas or any(not 0 < a <= 1 for a in s.average_alphas):
            raise ConfigError(f"data.kwargs.feedback.average_alphas: a list of numbers in (0, 1] (got {s.average_alphas})")
        if s.cap is not None and not 0 <= s.cap <= 1:
            raise ConfigError(f"data.kwargs.feedback.cap: must be between 0 and 1 (got {s.cap})")
        return s


@dataclass
class Incoming:
    """One round's feedback: utterance indices, what users typed, what the checks made of it."""

    idx: list[int]
    given: list[str]
    kinds: list[str]  # clean | format | wrong (known only because we injected them)
    words: list[Optional[list[str]]]  # normalised; None: not a digit transcript
    flagged: list[bool] = field(default_factory=list)

    def kept(self) -> list[int]:
        return [j for j, w in enumerate(self.words) if w is not None and not (self.flagged and self.flagged[j])]


class Trainer:
    """`fit` for the speech model: a Config from the recipe, a SpeechSource as the data."""

    def __init__(self, cfg, work: Path, quiet: bool = True):
        self.cfg, self.work, self.quiet, self.n = cfg, Path(work), quiet, 0

    def fit(self, name: str, src: SpeechSource, steps: int, init: Optional[Path] = None, methods: list = (),
            lr: Optional[float] = None):
        self.n += 1
        d = self.cfg.model_dump(by_alias=True)
        d["name"], d["methods"] = name, list(methods)
        d["loop"].update(max_steps=steps, max_epochs=None)
        d["data"]["bucketing"] = True
        if lr is not None:
            d["optim"]["lr"] = lr
        cfg = Config.model_validate(d)
        run_dir = self.work / "runs" / f"{self.n:03d}-{name}"
        r = fit(cfg, data=bundle(src), loss_fn=CTCTask(), run_dir=run_dir, init_from=init, quiet=self.quiet,
                overwrite=True)
        if r.summary.get("stopped_because") == "preempted":  # SIGTERM/SIGINT: stop the experiment, not just this run
            raise PreemptedError(f"{run_dir}: stopped by a signal; its checkpoint is kept, the rounds stop here")
        return r.model.eval(), run_dir


def make_incoming(data: SpeechData, cohort: str, s: FeedbackSettings, seed: int, part: int = 0,
                  parts: int = 1) -> Incoming:
    """The feedback of one round: `part` of `parts` of the cohort's training utterances (a cohort that
    comes back in a later round sends new utterances, every `parts`-th one), some transcripts wrong."""
    idx = data.select(cohort=cohort, split="train")[part::parts]
    if not idx:
        raise ConfigError(f"data.kwargs.feedback.rounds: cohort '{cohort}' has no utterances in the data "
                          "(see the data spec's cohorts)")
    rng = random.Random(f"{seed}-{cohort}")
    given, kinds = [], []
    for i in idx:
        text, kind = corrupt(data.rows[i]["transcript"].split(), rng, s.wrong_fraction, s.format_fraction)
        given.append(text)
        kinds.append(kind)
    return Incoming(idx, given, kinds, [normalize_transcript(t) for t in given])


def cross_fit_check(trainer: Trainer, data: SpeechData, inc: Incoming, init: Path, replay: SpeechSource,
                    s: FeedbackSettings, seed: int) -> dict:
    """Flag transcripts a checker trained on the other half contradicts; returns the review rows."""
    usable = [j for j, w in enumerate(inc.words) if w is not None]
    g = torch.Generator().manual_seed(seed)
    perm = [usable[k] for k in torch.randperm(len(usable), generator=g).tolist()]
    halves = [perm[: len(perm) // 2], perm[len(perm) // 2:]]
    src = data.source(inc.idx, [w or ["zero"] for w in inc.words])
    scores, hyps = torch.zeros(len(inc.idx)), [[] for _ in inc.idx]
    for a, b in ((0, 1), (1, 0)):
        if not halves[a] or not halves[b]:
            continue
        checker, _ = trainer.fit(f"check{a}", src.subset(halves[a]) + replay, s.check_steps, init)
        sc, hy = checks.contradiction_scores(checker, src.subset(halves[b]))
        for k, j in enumerate(halves[b]):
            scores[j], hyps[j] = sc[k], hy[k]
    inc.flagged = [j in set(usable) and f for j, f in
                   enumerate(checks.flag_contradictions(scores, hyps, src.label_ids, s.contradiction_threshold))]
    rows = [{"id": data.rows[inc.idx[j]]["id"], "given": inc.given[j], "normalised": " ".join(inc.words[j] or []),
             "model_reads": decode(hyps[j]), "score": round(float(scores[j]), 3),
             "reason": "not a digit transcript" if inc.words[j] is None else "contradicted"}
            for j in range(len(inc.idx)) if inc.words[j] is None or inc.flagged[j]]
    return {"review": sorted(rows, key=lambda r: -r["score"])}


def label_accounting(inc: Incoming) -> dict:
    wrong = [j for j, k in enumerate(inc.kinds) if k == "wrong"]
    caught = [j for j in wrong if inc.words[j] is None or inc.flagged[j]]
    fmt = [j for j, k in enumerate(inc.kinds) if k == "format"]
    false_flags = sum(1 for j, k in enumerate(inc.kinds) if k != "wrong" and inc.flagged and inc.flagged[j])
    return {"wrong": len(wrong), "wrong_caught": len(caught), "format": len(fmt),
            "format_normalised": sum(1 for j in fmt if inc.words[j] is not None), "false_flags": false_flags}


class Replay:
    """A bounded, cohort-balanced store of past utterances (dataset indices and their kept words),
    chosen with methods.replay.balanced; mixed into a round's data at `ratio`."""

    def __init__(self, size: int, seed: int):
        self.size, self.seed = size, seed
        self.items: list[tuple[int, list[str], str]] = []

    def add(self, data: SpeechData, idx: list[int], words: list[list[str]]) -> None:
        pool = self.items + [(i, w, data.rows[i]["cohort"]) for i, w in zip(idx, words)]
        names = sorted({c for _, _, c in pool})
        keys = torch.tensor([names.index(c) for _, _, c in pool])
        keep = balanced(keys, min(self.size, len(pool)), torch.Generator().manual_seed(self.seed + len(pool)))
        self.items = [pool[k] for k in sorted(keep.tolist())]

    def sample(self, data: SpeechData, n: int, seed: int) -> SpeechSource:
        g = torch.Generator().manual_seed(seed)
        pick = torch.randperm(len(self.items), generator=g)[: max(1, min(n, len(self.items)))].tolist()
        return data.source([self.items[k][0] for k in pick], [self.items[k][1] for k in pick])

    def to_json(self) -> list:
        return [[i, " ".join(w)] for i, w, _ in self.items]
