"""Knowledge distillation: train this model (the student, usually smaller) on a trained teacher's
soft targets as well as the labels.

    methods:
      - name: distill
        teacher: runs/big-20261202-1200     # a run folder, a checkpoint folder, or a .safetensors file
        # teacher_model: {name: cnn, kwargs: {channels: 64}}   # needed for a bare .safetensors file only
        alpha: 0.5                          # loss = alpha * KD + (1 - alpha) * task loss
        temperature: 2.0
        cache: true                         # the teacher's logits over the train set, once
        count_teacher: true                 # the teacher's own training FLOPs count in this run's ledger

The KD term is `methods.kd.kd_loss` (the one KD loss; LwF uses it too), logged as `loss_kd`; the
task loss is weighted by `task_weight = 1 - alpha` (read by the Objective).

What the ledger counts. `cache: true`: one teacher forward pass over the train set at the start,
measured with FlopCounterMode and added as `flops.extra["distill.teacher_cache"]`; the logits ride
in the checkpoint (N x classes floats), so a resume neither pays nor counts it again. `cache:
false`: the teacher's forward runs inside every measured training step, so the ledger counts it
there. The teacher's own training: its run's ledger.json FLOPs are added as
`flops.extra["distill.teacher_training"]` when `count_teacher` (summary.json
`methods.distill.teacher_cost_included` says whether they were; a bare file or a teacher without
ledger.json cannot be counted, and the summary says so). Only FLOPs are added: the teacher's CPU
time and energy stay in its own ledger.

The cache is keyed by the sample's index in the train source, so it needs the inputs the teacher saw:
it is refused with `data.augment` on (the student would see a shifted signal and the teacher's logits
of the clean one), with `data.workers > 0` (the indices are read in the training process) and with
selective_backprop (it drops samples after they are read);
use `cache: false` there, which runs the teacher on the very batch the student sees.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

from ecotrain.checkpoint.format import load_state_dict_file
from ecotrain.checkpoint.snapshot import load_model_weights
from ecotrain.base.errors import ConfigError
from ecotrain.base.log import log
from ecotrain.methods.base import Method, TrainedRuns
from ecotrain.methods.kd import kd_loss
from ecotrain.models import build_model
from ecotrain.base.runfiles import CHECKPOINTS, LEDGER, RunFiles

CACHE_BATCH = 512


class _IndexRecorder:
    """The train source, noting the indices of the last batch taken: the teacher cache's keys."""

    def __init__(self, source):
        self.source, self.last = source, None

    def __len__(self) -> int:
        return len(self.source)

    def take(self, idx):
        self.last = idx
        return self.source.take(idx)

    def labels(self):
        return self.source.labels()


def _row_offset(xm: torch.Tensor) -> tuple[int, int]:
    """(first row of micro-batch `xm` in its effective batch, the batch's rows): `x.split` makes views."""
    base = xm._base if xm._base is not None else xm
    return (xm.storage_offset() - base.storage_offset()) // max(xm.stride(0), 1), base.shape[0]


def teacher_cost(path: Path, read_ledger) -> dict:
    """The teacher's training cost from its run's ledger.json (a checkpoint's run folder too), read by
    `read_ledger` (accounting.read_ledger, handed in by assemble: the methods sit below the accounting wing)."""
    run = path.parent.parent if path.parent.name == CHECKPOINTS else path
    if not RunFiles(run).ledger.is_file():
        return {"teacher_cost_note": f"no {LEDGER} in {run}: the teacher's training cost is unknown"}
    if read_ledger is None:
        return {"teacher_cost_note": f"the teacher's training cost is unknown: build the methods with "
                                     f"build_methods(cfg, read_ledger=ecotrain.accounting.read_ledger) to read {LEDGER}"}
    ledger = read_ledger(run)
    flops = (ledger.get("flops") or {}).get("total")
    co2e = (ledger.get("co2e") or {}).get("kg")
    return {"teacher_run": str(run), "teacher_flops": flops, "teacher_cpu_seconds": ledger.get("cpu_seconds"),
            "teacher_co2e_kg": co2e}


class Distill(Method):
    needs = ("xy",)  # (x, y) tensor batches of a classification-like task (assemble.check_methods_fit)
    def __init__(self, cfg, run, trained=None):
        self.key = "distill"
        trained = trained or TrainedRuns()
        self.load_trained = trained.load_trained  # rebuilds a teacher run's model
        self.read_ledger = trained.read_ledger  # reads the teacher run's ledger.json
        self.cfg, self.alpha, self.temperature = cfg, cfg.alpha, cfg.temperature
        self.task_weight = 1.0 - cfg.alpha  # the Objective weights the task loss by this
        aug = run.data.augment
        if cfg.cache and (aug.shift or aug.scale or aug.noise):
            raise ConfigError("methods.distill.cache: the teacher's logits are cached per sample without "
                              "augmentation, but data.augment is on; set cache: false (the teacher then sees "
                              "each augmented batch) or turn data.augment off")
        if cfg.cache and getattr(run.data, "workers", 0):
            raise ConfigError("methods.distill.cache: needs data.workers: 0 (the cache is keyed by the batch's "
                              "sample indices, read in the training process); or set cache: false")
        if cfg.cache and "selective_backprop" in {m.name for m in run.methods}:
            raise ConfigError("methods.distill.cache: selective_backprop drops samples from each batch after they are "
                              "read, so the cached logits cannot follow them; set cache: false")
        if run.distributed.strategy == "fsdp":
            raise ConfigError("methods.distill: not supported with distributed.strategy=fsdp; use ddp or one process")
        self.teacher = None
        self.source = None
        self.cache: torch.Tensor | None = None  # [train samples, classes] teacher logits
        self.cache_labels: torch.Tensor | None = None
        self.counted = False  # the teacher's training FLOPs were added to the ledger (once, not per segment)
        self.facts: dict = {}
        self._checked = False

    # -- set-up ------------------------------------------------------------------------------
    def data(self, source, sampler):
        self.source = _IndexRecorder(source) if self.cfg.cache else source
        if self.teacher is None:  # here, while the run is assembled: a bad teacher is refused before anything is written
            self.teacher = self._load_teacher(torch.device("cpu"))
        return self.source, sampler

    def on_fit_start(self, state):
        self.teacher = self.teacher.to(state.device)
        if not self.counted:
            self._count_teacher(state)
        if self.cfg.cache and self.cache is None:
            self._fill_cache(state)
        elif self.cache is not None:  # restored from a checkpoint (on the CPU)
            self.cache, self.cache_labels = self.cache.to(state.device), self.cache_labels.to(state.device)
        self._checked = False

    def _load_teacher(self, device) -> torch.nn.Module:
        path, tm = Path(self.cfg.teacher), self.cfg.teacher_model
        where = f"methods.distill.teacher: {path}"
        if not path.exists():
            raise ConfigError(f"{where}: not found; give a run folder, a checkpoint folder or a .safetensors file")
        if path.is_dir():
            if tm is not None:
                raise ConfigError(f"{where}: a folder says its own model (its config); drop methods.distill.teacher_model")
            if self.load_trained is None:
                raise ConfigError(f"{where}: a teacher run folder needs the run's model loader; build the methods "
                                  "with build_methods(cfg, load_trained=ecotrain.export.inference.load_trained)")
            teacher = self.load_trained(path, "cpu").model
            self.facts.update(teacher_cost(path, self.read_ledger))
        else:
            if tm is None:
                raise ConfigError(f"{where}: a weights file does not say which model it is; set "
                                  "methods.distill.teacher_model (e.g. {name: cnn, kwargs: {channels: 64}})")
            x0, _ = self.source.take(torch.tensor([0]))
            classes = int(self.source.labels().max()) + 1
            teacher = build_model(tm, tuple(x0.shape[1:]), classes)
            load_model_weights(teacher, load_state_dict_file(path, "methods.distill.teacher"), path)
            self.facts["teacher_cost_note"] = "a bare weights file: the teacher's training cost is unknown"
        self.facts["teacher"] = str(path)
        self.facts["teacher_parameters"] = sum(p.numel() for p in teacher.parameters())
        return teacher.to(device).eval().requires_grad_(False)

    def _count_teacher(self, state) -> None:
        flops = self.facts.get("teacher_flops")
        included = bool(self.cfg.count_teacher and flops)
        if included:
            state.add_flops(flops, "distill.teacher_training")
        elif not self.cfg.count_teacher:
            self.facts["teacher_cost_note"] = "count_teacher: false (e.g. a teacher shared by many students)"
        self.facts["teacher_cost_included"] = included
        self.counted = True

    @torch.no_grad()
    def _fill_cache(self, state) -> None:
        src, n = self.source.source, len(self.source)
        outs = []
        with FlopCounterMode(display=False) as counter:
            for start in range(0, n, CACHE_BATCH):
                x, _ = src.take(torch.arange(start, min(start + CACHE_BATCH, n)))
                outs.append(self.teacher(x.to(state.device)).float())
        logits = torch.cat(outs)
        if logits.dim() != 2:
            raise ConfigError(f"methods.distill.cache: the teacher's output is {tuple(logits.shape[1:])} per sample; "
                              "caching is for classifiers (one row of logits per sample): set cache: false")
        flops = float(counter.get_total_flops())
        state.add_flops(flops, "distill.teacher_cache")
        self.cache, self.cache_labels = logits, src.labels().to(state.device)
        self.facts["cache_flops"] = flops
        log.info(f"distill: cached the teacher's logits for {n} train samples ({flops:.3g} FLOPs, counted once)")

    # -- per micro-batch ---------------------------------------------------------------------
    def loss_terms(self, batch, outputs, state):
        x, y = batch
        if self.cache is None:
            with torch.no_grad():  # inside the measured step: the ledger counts this forward
                teacher = self.teacher(x)
        else:
            row, rows = _row_offset(x)
            idx = self.source.last
            if idx is None or rows != len(idx):
                raise ConfigError("methods.distill.cache: a method changed the batch's samples after they were read "
                                  f"({rows} rows for {0 if idx is None else len(idx)} indices), so the cached logits "
                                  "cannot be matched to them; set cache: false")
            idx = idx[row:row + len(y)].to(self.cache.device)
            teacher = self.cache.index_select(0, idx)
            if not self._checked:  # once per segment: the rows are the samples the cache was keyed by
                if not torch.equal(self.cache_labels.index_select(0, idx), y):
                    raise ConfigError("methods.distill.cache: the batch's labels differ from the cached samples' "
                                      "(a method reorders the batch); set cache: false")
                self._checked = True
        if teacher.shape != outputs.shape:
            raise ConfigError(f"methods.distill: the teacher's output {tuple(teacher.shape[1:])} does not match the "
                              f"student's {tuple(outputs.shape[1:])} (same classes needed)")
        return {"kd": self.alpha * kd_loss(outputs, teacher, self.temperature)}

    # -- results and resume ------------------------------------------------------------------
    def summary(self) -> dict:
        return {"alpha": self.alpha, "temperature": self.temperature, "cache": self.cfg.cache, **self.facts}

    def state_dict(self) -> dict:
        return {"counted": self.counted, "facts": dict(self.facts), "cache": self.cache,
                "cache_labels": self.cache_labels}

    def load_state_dict(self, sd: dict) -> None:
        self.counted, self.facts = sd["counted"], dict(sd["facts"])
        self.cache, self.cache_labels = sd["cache"], sd["cache_labels"]
