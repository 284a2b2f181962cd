"""Learning without forgetting (Li & Hoiem, 2016): keep the previous version's outputs.

    methods:
      - name: lwf
        teacher: runs/v1   # the previous version: its run folder (model.safetensors) or the weights file
        alpha: 1.0         # loss = CE + alpha * KD, logged as loss_lwf
        temperature: 2.0
        on_new: true       # distil on the new rows
        on_replay: true    # with methods.replay: distil on the replay rows too

The teacher is this run's own model (same config) loaded with the previous version's weights,
frozen, in eval mode. Its logits on every training row (and on the replay rows) are the soft
targets of `methods.kd.kd_loss`, the one KD function distillation uses too. No teacher (the
first version): the term is off.

Token data (a language model): the KL is taken per position, over the positions whose target
counts (not IGNORE: padding, document boundaries), a mean per token; a dict batch reaches the
teacher as it reaches the student (the task's forward: its attention mask too).

When it helps: with replay (the replay rows carry the old classes' soft targets, richer than their
labels); on its own it keeps shared features but not old classes in a class-incremental head
(van de Ven et al.: ~0.22 on Split MNIST). Risks: a teacher that was wrong is copied; alpha too
large stops the new task being learnt. Cost: one teacher forward per row (no backward), a copy of
the model in memory.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch

from ecotrain.checkpoint.format import load_state_dict_file
from ecotrain.checkpoint.snapshot import load_model_weights
from ecotrain.base.errors import ConfigError
from ecotrain.methods.base import Method
from ecotrain.methods.kd import kd_loss
from ecotrain.methods.replay import IGNORE, Replay, check_pinned, file_digest, run_file
from ecotrain.core.task import logits_of
from ecotrain.base.runfiles import MODEL


def teacher_file(path: str | Path, where: str = "methods.lwf.teacher") -> Path:
    return run_file(path, where, MODEL)


def load_teacher(student: torch.nn.Module, path: Path) -> torch.nn.Module:
    """A frozen copy of `student` holding the weights at `path`. A student with PEFT adapters
    injected gets the plain weights in its base layers and zero adapters (the plain model's outputs)."""
    teacher = copy.deepcopy(student)
    saved = load_state_dict_file(path)
    own = teacher.state_dict()
    if any(".base_layer." in k for k in own) and not any(".base_layer." in k for k in saved):
        mapped = {}
        for k, v in own.items():
            plain = k.replace(".base_layer.", ".")
            mapped[k] = saved.get(plain, v) if "lora_" not in k else (torch.zeros_like(v) if "lora_B" in k else v)
        saved = mapped
    load_model_weights(teacher, saved, f"methods.lwf.teacher: {path}")
    return teacher.eval().requires_grad_(False)


class LwF(Method):
    needs = ("xy",)  # (x, y) tensor batches of a classification-like task (assemble.check_methods_fit)
    dicts = True  # ... or token batches: dicts of tensors with a per-token target
    def __init__(self, cfg, run, trained=None):
        if run.distributed.strategy == "fsdp":
            raise ConfigError("methods.lwf: not supported with distributed.strategy=fsdp; use ddp or one process")
        self.key, self.cfg = "lwf", cfg
        self.path = teacher_file(cfg.teacher) if cfg.teacher else None
        self.digest = file_digest(self.path) if self.path else None
        self.teacher = None
        self.replay = None

    def on_fit_start(self, state):
        if self.path is not None and self.teacher is None:
            self.teacher = load_teacher(state.dist.unwrap(state.model), self.path)
        if self.cfg.on_replay and state.methods:
            self.replay = next((m for m in state.methods.methods if isinstance(m, Replay)), None)

    def loss_terms(self, batch, outputs, state):
        if self.teacher is None:
            return {}
        task = state.objective.task
        y = task.targets(batch)
        if per_position(y, outputs):  # a target per position (a language model); not CTC's label sequences
            return self._token_terms(task, batch, y, outputs, state)
        x, _ = batch
        student, inputs = ([outputs], [x]) if self.cfg.on_new else ([], [])
        if self.replay is not None:
            logits = self.replay.replay_logits(state, outputs)  # the same forward as CE(replay)
            if logits is not None:
                student.append(logits)
                inputs.append(self.replay.replay_batch(state)[0])
        if not student:
            return {}
        with torch.no_grad():
            teacher = [self.teacher(i) for i in inputs]
        return {"lwf": self.cfg.alpha * kd_loss(torch.cat(student), torch.cat(teacher), self.cfg.temperature)}

    def _token_terms(self, task, batch, y, outputs, state):
        """KL per position over the positions whose target counts, on the new rows and the replay rows."""
        student, teacher = [], []
        if self.cfg.on_new:
            keep = y != IGNORE
            student.append(logits_of(outputs)[keep])
            with torch.no_grad():
                teacher.append(logits_of(task.forward(self.teacher, batch))[keep])
        if self.replay is not None:
            logits = self.replay.replay_logits(state, outputs)
            if logits is not None:
                rx, ry, _ = self.replay.replay_batch(state)
                keep = ry != IGNORE
                student.append(logits[keep])
                with torch.no_grad():
                    teacher.append(logits_of(self.teacher(rx))[keep])
        if not student:
            return {}
        return {"lwf": self.cfg.alpha * kd_loss(torch.cat(student), torch.cat(teacher), self.cfg.temperature)}

    def summary(self) -> dict:
        return {"teacher": str(self.path), "alpha": self.cfg.alpha} if self.path else {}

    def state_dict(self) -> dict:
        return {"teacher_digest": self.digest}

    def load_state_dict(self, sd: dict) -> None:
        check_pinned(sd, "teacher_digest", self.digest, "methods.lwf.teacher", self.path, "the teacher")


def per_position(y, outputs) -> bool:
    """Targets that name one class per position of the logits (`[B, T]` beside `[B, T, V]`). A speech
    model's CTC targets are 2-D too, but a label sequence of another length: KL over the whole output."""
    if not isinstance(y, torch.Tensor) or y.ndim < 2:
        return False
    logits = logits_of(outputs)
    return isinstance(logits, torch.Tensor) and tuple(logits.shape[:-1]) == tuple(y.shape)
