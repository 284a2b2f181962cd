"""Curriculum ordering: the first epochs go from easy to hard samples, by a per-sample score.

    methods:
      - name: curriculum
        score: loss            # loss: each sample's loss under a trained reference model
        reference: runs/ref    #   (a run folder or checkpoint folder); or score: file, path: s.npy
        epochs: 2              # epochs ordered easy to hard; later ones: the plain seeded shuffle
        window: 4              # batches shuffled together inside the order
        count_reference: true  # the reference's own training FLOPs (its ledger.json) count here too

Epoch e < epochs: a seeded permutation of the samples, stably sorted by score (equal scores in
random order), then shuffled inside consecutive windows of `window` batches, so batches mix
samples of similar difficulty and differ from epoch to epoch. The order is a function of (seed,
epoch, the scores); the scores are computed once, on a fresh start, and saved in the checkpoint,
so a resume neither recomputes nor pays for them again. Scoring with `reference` is a forward pass
over the train split, counted with FlopCounterMode and charged to the run (`flops.extra`
`curriculum_scoring`), as is the reference's training when `count_reference` is on.

When it helps: noisy data or a hard task where the first updates are wasted on samples the model
cannot yet fit. Risks: the easy-to-hard order is a distribution shift inside each ordered epoch
(a cosine schedule's high LR meets the easy samples only); a reference trained on this very split
ranks what it memorised. Cost: one forward over the train split, plus the reference's training.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from ecotrain.base import safefile
from ecotrain.core.flops import count_flops
from ecotrain.data.sampler import EpochSampler
from ecotrain.base.errors import ConfigError, DataError
from ecotrain.base.log import log
from ecotrain.methods.base import Method, TrainedRuns
from ecotrain.methods.sampling import generator
from ecotrain.methods.selective import per_sample_loss
from ecotrain.base.userpath import user_path
from ecotrain.base.runfiles import LEDGER, RunFiles

_SALT = 7


def easy_to_hard(scores: torch.Tensor, batch_size: int, window: int, g: torch.Generator) -> torch.Tensor:
    """A permutation: ascending score, equal scores in random order, shuffled inside windows of
    `window` batches."""
    perm = torch.randperm(len(scores), generator=g)
    order = perm[torch.argsort(scores[perm], stable=True)]
    w = window * batch_size
    for c in range(0, len(order), w):
        chunk = order[c:c + w]
        order[c:c + w] = chunk[torch.randperm(len(chunk), generator=g)]
    return order


class CurriculumSampler:
    def __init__(self, base: EpochSampler, method: "Curriculum"):
        self.base, self.method = base, method
        self.n, self.batch_size, self.seed = base.n, base.batch_size, base.seed

    def __len__(self) -> int:
        return len(self.base)

    def epoch_order(self, epoch: int) -> torch.Tensor:
        if epoch >= self.method.epochs:
            return self.base.order(epoch)
        return easy_to_hard(self.method.scores, self.batch_size, self.method.window,
                            generator(self.seed, epoch, _SALT))

    def batches(self, epoch: int, start: int = 0):
        order = self.epoch_order(epoch)
        for b in range(start, len(self)):
            yield order[b * self.batch_size:(b + 1) * self.batch_size]


class Curriculum(Method):
    needs = ("xy",)  # (x, y) tensor batches of a classification-like task (assemble.check_methods_fit)
    def __init__(self, cfg, run=None, trained=None):
        self.key, self.cfg, self.epochs, self.window = "curriculum", cfg, cfg.epochs, cfg.window
        self.load_trained = (trained or TrainedRuns()).load_trained  # rebuilds the reference run's model
        self.scores: torch.Tensor | None = None
        self.source = None
        self.report: dict = {"score": cfg.score, "epochs": cfg.epochs}

    def data(self, source, sampler):
        if not isinstance(sampler, EpochSampler):
            raise ConfigError(f"methods.curriculum: it orders the engine's plain shuffle (got {type(sampler).__name__});"
                              " list it after dedup and before batch_ramp, and without data.bucketing")
        self.source = source
        if self.cfg.score == "loss" and not Path(self.cfg.reference).is_dir():
            raise ConfigError(f"methods.curriculum.reference: {self.cfg.reference} is not a folder; give a trained "
                              "run folder or checkpoint folder")
        if self.cfg.score == "file":
            self.scores = self._from_file(Path(self.cfg.path), len(source))
        return source, CurriculumSampler(sampler, self)

    @staticmethod
    def _from_file(path: Path, n: int) -> torch.Tensor:
        user_path(path, "methods.curriculum.path", f"give an .npy file of {n} scores, one per train sample",
                  error=DataError)  # a FIFO would block the read forever
        try:
            with safefile.open_regular(path, "scores file", error=DataError) as fh:
                a = np.load(fh, allow_pickle=False)
        except DataError:
            raise
        except Exception as exc:
            raise DataError(f"methods.curriculum.path: cannot read {path} as .npy ({type(exc).__name__}: {exc})") from None
        if a.ndim != 1 or len(a) != n or not np.issubdtype(a.dtype, np.number) or not np.isfinite(a).all():
            raise DataError(f"methods.curriculum.path: {path} holds {a.dtype} {a.shape}; expected {n} finite numbers, "
                            "one per train sample (in the train split's order, after dedup)")
        return torch.as_tensor(a, dtype=torch.float64)

    def on_fit_start(self, state):
        if self.scores is None:  # a fresh start with score: loss (a resume loaded them)
            self.scores = self._score_with_reference(state)
        log.info(f"curriculum: epochs 0-{self.epochs - 1} ordered easy to hard by {self.cfg.score} "
                 f"(scores {float(self.scores.min()):.3g} to {float(self.scores.max()):.3g})")

    def _score_with_reference(self, state) -> torch.Tensor:
        if self.load_trained is None:
            raise ConfigError("methods.curriculum: score by a reference run needs the run's model loader; build "
                              "the methods with build_methods(cfg, load_trained=ecotrain.export.inference.load_trained)")
        ref = self.load_trained(self.cfg.reference, state.device.type)
        out: list[torch.Tensor] = []

        def forward_all():
            with torch.no_grad():
                for s in range(0, len(self.source), 512):
                    x, y = self.source.take(torch.arange(s, min(s + 512, len(self.source))))
                    x, y = x.to(ref.device), y.to(ref.device)
                    out.append(per_sample_loss(state.task, ref.model(x), (x, y)).double().cpu())

        try:
            flops = count_flops(ref.model, forward_all, len(self.source)).total
        except RuntimeError as exc:  # a reference trained on other inputs (shape, classes)
            raise ConfigError(f"methods.curriculum.reference: {self.cfg.reference} cannot score this run's train "
                              f"samples ({str(exc).splitlines()[0][:160]}); give a run trained on the same data") from None
        state.add_flops(float(flops), "curriculum_scoring")
        self.report.update(reference=str(self.cfg.reference), scoring_flops=float(flops))
        if self.cfg.count_reference:
            trained = _reference_training_flops(Path(self.cfg.reference))
            self.report["reference_training_flops"] = trained
            if trained is None:
                log.warning(f"curriculum: no {LEDGER} for {self.cfg.reference}; its training cost is not counted")
            else:
                state.add_flops(trained, "curriculum_reference_training")
        return torch.cat(out)

    def summary(self) -> dict:
        return dict(self.report)

    def state_dict(self) -> dict:
        return {"scores": self.scores, "report": json.dumps(self.report)}

    def load_state_dict(self, sd: dict) -> None:
        self.scores, self.report = sd["scores"], json.loads(sd["report"])


def _reference_training_flops(path: Path):
    for folder in (path, path.parent.parent):  # a run folder, or a checkpoint inside one
        f = RunFiles(folder).ledger
        if f.is_file():
            ledger = safefile.read_json(f, "ledger", 64 * safefile.MiB)
            if not isinstance(ledger, dict):
                raise ConfigError(f"{f}: the ledger is not a JSON object; the run folder is damaged")
            flops = (ledger.get("flops") or {}).get("total")
            return float(flops) if flops is not None else None
    return None
