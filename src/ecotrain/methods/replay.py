"""Experience replay: a bounded buffer of past examples, replayed in every training step.

    methods:
      - name: replay
        size: 500            # examples kept, at most
        ratio: 0.2           # each step: 80% new rows (the batch), 20% replay rows
        weight: 1.0          # lambda: loss = CE(new) + lambda * CE(replay), logged as loss_task, loss_replay
        selection: balanced  # class-balanced, or reservoir (a uniform sample of everything seen)
        hard_weight: 2.0     # kept examples the model gets wrong weigh 2 in CE(replay)
        from: runs/v1        # the previous version's buffer (its export.safetensors)
        logits: true         # DER++: the buffer keeps each example's logits, replayed as a target too
        logit_weight: 0.5    # loss += logit_weight * MSE(logits, stored logits), logged as loss_replay_logits

Each step replays `rows = round(batch * ratio / (1 - ratio))` buffer examples: epoch e's replay
order is a seeded permutation of the buffer (a function of (seed, epoch)), read `rows` at a time
by the batch's index, so a resume replays exactly what the uninterrupted run did. The replay rows
get their own forward pass inside the step (the same autocast), CE(replay) a weighted mean.

At the end of the run (`finalize`) the buffer is updated with this run's training data and
exported as tensors (x, y, weight, seen) into export.safetensors under `replay/`: the next
version's `from`. The weights are recomputed then: `hard_weight` for the examples the final model
misclassifies, and with `rare_weight` median/count for the classes rarer than the median.

With `logits` (DER++, Buzzega et al. 2020, "Dark Experience for General Continual Learning") each
stored example keeps the logits (eval mode) of the model that stored it: this run's final model
for the examples it adds, the stored ones kept for the examples carried over. The replay rows then
add `logit_weight * MSE(logits, stored)` (the paper's alpha; `weight` is its beta). A `from`
buffer exported without logits gets those of the model the run starts from (init_from: the
previous version), computed once before the first step and kept in the checkpoint.

Token data (a language model: per-token targets, `(x, y)` windows or dict items): the buffer keeps
`size` windows of token ids and their per-token targets (x, y int64 `[n, T]`; of a dict item the
`input_ids` and the target, its other entries, an attention mask, dropped: the replay rows run
under the model's own causal mask). The windows are a uniform sample of every window seen
(reservoir, vectorised, whatever `selection` says: tokens have no classes to balance), and only the
chosen windows are read from the data. CE(replay) is the mean over the replay rows' target tokens,
each row's tokens weighted by its `weight`. `logits`, `hard_weight` and `rare_weight` are
classifier settings, refused in one line (a window's logits are `[T, vocab]`).

When it helps: class-incremental updates, where nothing else keeps the old classes' logits alive;
a language model's update on a shifted corpus (the old corpus's windows keep its perplexity).
Risks: a small buffer overfits (the same few hundred examples every epoch); stored examples are
user data (retention rules apply). Cost: `ratio / (1 - ratio)` more forward/backward rows per step,
`size` examples of storage per version.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from ecotrain.base import safefile
from ecotrain.core.device import current_index, same_device
from ecotrain.base.errors import CheckpointError, ConfigError
from ecotrain.methods.base import Method
from ecotrain.core.task import TARGET_KEYS, SequenceTask, logits_of
from ecotrain.base.tensorfile import read_tensors
from ecotrain.base.userpath import user_path
from ecotrain.base.runfiles import EXPORT, RunFiles

IGNORE = SequenceTask.IGNORE  # a target the loss skips


@dataclass
class Buffer:
    x: torch.Tensor  # [n, ...] float, or int64 token ids [n, T]
    y: torch.Tensor  # [n] int64, or per-token targets [n, T]
    weight: torch.Tensor  # [n] float32, the loss weight of each example
    seen: int = 0  # examples offered to the buffer so far, every version (reservoir sampling needs it)
    logits: Optional[torch.Tensor] = None  # [n, classes] float32: each example's stored logits (DER++), or None

    def __len__(self) -> int:
        return len(self.y)

    def tensors(self) -> dict[str, torch.Tensor]:
        out = {"x": self.x, "y": self.y, "weight": self.weight, "seen": torch.tensor([self.seen])}
        if self.logits is not None:
            out["logits"] = self.logits
        return out


def file_digest(path: Path) -> str:
    """sha256 of a file: a method records what its `from`/`teacher` file held, and a resume checks it."""
    h = hashlib.sha256()
    with safefile.open_regular(path, "method file") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def check_pinned(sd: dict, key: str, digest: Optional[str], where: str, path, what: str) -> None:
    """A resume refuses a `from`/`teacher` file that differs from the one the run started with
    (its digest rides in the checkpoint under `key`): the run would go on against other weights."""
    if sd.get(key) != digest:
        raise CheckpointError(f"{where}: {path} changed since the run started; resume with {what} it started from")


def run_file(path: str | Path, where: str, name: str = EXPORT) -> Path:
    """A run folder's (or version folder's) file `name`, or the .safetensors file given."""
    p = Path(path)
    if p.is_dir():
        p = p / name
    return user_path(p, where, f"give the previous run folder or its {name}")  # a FIFO would block the read


def exported_file(path: str | Path, where: str) -> Path:
    p = Path(path)
    if p.is_dir() and RunFiles(p).config.is_file() and not RunFiles(p).export.exists():
        method = where.split(".")[1] if where.count(".") >= 2 else "this method"
        raise ConfigError(f"{where}: {p} is a run folder without {EXPORT}; was it trained with "
                          f"methods.{method}? Give a run (or version) that was")
    return run_file(path, where)


def read_exported(path: Path, key: str, where: str) -> dict[str, torch.Tensor]:
    """The tensors a method exported under `key/` (finish writes them so), the prefix removed."""
    from safetensors import SafetensorError

    try:
        tensors = read_tensors(path, where)  # export.safetensors is written by tensorfile (aliases)
    except (SafetensorError, OSError) as exc:
        raise CheckpointError(f"{where}: {path} is not a readable safetensors file ({exc})") from None
    prefix = f"{key}/"
    out = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
    if not out:
        raise CheckpointError(f"{where}: {path} holds nothing under '{prefix}' (keys: {sorted(tensors)[:6]}); "
                              f"was the previous run trained with methods.{key}?")
    return out


def load_buffer(path: str | Path, where: str = "methods.replay.from") -> Buffer:
    p = exported_file(path, where)
    t = read_exported(p, "replay", where)
    missing = [k for k in ("x", "y", "weight", "seen") if k not in t]
    if missing:
        raise CheckpointError(f"{where}: {p} has no replay/{missing[0]}; it is not a replay buffer")
    n = len(t["y"])
    if len(t["x"]) != n or len(t["weight"]) != n:
        raise CheckpointError(f"{where}: {p}: x, y and weight have different lengths ({len(t['x'])}, {n}, "
                              f"{len(t['weight'])}); the file is damaged")
    logits = t.get("logits")
    if logits is not None and len(logits) != n:
        raise CheckpointError(f"{where}: {p}: {len(logits)} rows of logits for {n} examples; the file is damaged")
    x = t["x"].float() if t["x"].is_floating_point() else t["x"].long()  # token ids stay ids
    return Buffer(x, t["y"].long(), t["weight"].float(), int(t["seen"][0]), None if logits is None else logits.float())


# -- filling the buffer ------------------------------------------------------------------------
def reservoir(old_n: int, seen: int, new_n: int, size: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Algorithm R over a stream: the buffer holds `old_n` examples out of `seen`; `new_n` more
    arrive. Returns (slot of each kept new example, its index in the new data): every example of
    the whole stream ends up kept with probability size / (seen + new_n)."""
    slots: dict[int, int] = {}  # buffer slot -> index in the new data (a later arrival may replace an earlier)
    n = old_n
    for i in range(new_n):
        if n < size:  # not full yet: append
            slots[n] = i
            n += 1
            continue
        j = int(torch.randint(0, seen + i + 1, (1,), generator=g))
        if j < size:
            slots[j] = i
    order = sorted(slots)
    return torch.tensor(order, dtype=torch.long), torch.tensor([slots[s] for s in order], dtype=torch.long)


def reservoir_vectorised(old_n: int, seen: int, new_n: int, size: int, g: torch.Generator
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """`reservoir`'s result with one draw per new example at once (a million windows in milliseconds):
    the first arrivals fill the free slots, each later one i draws j uniform in [0, seen + i] and
    takes slot j when j < size, a later arrival replacing an earlier (the largest index wins)."""
    fill = max(0, min(size - old_n, new_n))
    # no slot past seen + new_n can be drawn: a `size` far above the stream allocates only what it holds
    best = torch.full((min(size, max(seen, old_n) + new_n),), -1, dtype=torch.long)
    best[old_n:old_n + fill] = torch.arange(fill)
    rest = torch.arange(fill, new_n)
    if len(rest):
        j = (torch.rand(len(rest), generator=g, dtype=torch.float64) * (seen + rest + 1).double()).long()
        keep = j < size
        best.scatter_reduce_(0, j[keep], rest[keep], reduce="amax")
    slots = (best >= 0).nonzero().flatten()
    return slots, best[slots]


def token_rows(batch, target=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(token ids, per-token targets) of a batch: an `(x, y)` pair as it is; a dict's `input_ids` (or its
    one other tensor) and its target (`target`, else labels/label/y/target/targets)."""
    if isinstance(batch, (tuple, list)):
        return batch[0], batch[1]
    key = target if isinstance(target, str) else next((k for k in TARGET_KEYS if k in batch), None)
    if key is None or key not in batch:
        raise ConfigError(f"methods.replay: a dict batch without a target (keys: {sorted(batch)[:8]}); name it "
                          "labels or set task.target")
    others = [k for k, v in batch.items() if k != key and isinstance(v, torch.Tensor)]
    ids = "input_ids" if "input_ids" in batch else (others[0] if len(others) == 1 else None)
    if ids is None:
        raise ConfigError(f"methods.replay: keeps token windows as input_ids and targets; this dict batch's inputs "
                          f"are {others}: name the token ids input_ids")
    return batch[ids], batch[key]


def balanced(keys: torch.Tensor, size: int, g: torch.Generator) -> torch.Tensor:
    """Indices of at most `size` rows with as equal a count per key (class or cohort) as the data
    allows: a key with fewer rows than its share gives the rest to the others (water-filling).
    Within a key the rows are a seeded random subset. Sorted by key, then by draw."""
    groups = {int(k): (keys == k).nonzero().flatten() for k in torch.unique(keys)}
    counts = {k: len(v) for k, v in groups.items()}
    quota, left = {k: 0 for k in groups}, min(size, len(keys))
    open_keys = sorted(groups)
    while left > 0 and open_keys:
        share = max(1, left // len(open_keys))
        for k in list(open_keys):
            take = min(share, counts[k] - quota[k], left)
            quota[k] += take
            left -= take
            if quota[k] == counts[k]:
                open_keys.remove(k)
            if left == 0:
                break
    out = [groups[k][torch.randperm(counts[k], generator=g)[:quota[k]]] for k in sorted(groups)]
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.long)


def example_weights(y: torch.Tensor, wrong: torch.Tensor, hard_weight: float, rare: bool) -> torch.Tensor:
    """The loss weight of each candidate: `hard_weight` where the model is wrong, times median/count
    (at most 10) for the classes rarer than the median with `rare`."""
    w = torch.ones(len(y))
    if hard_weight != 1.0:
        w[wrong] = hard_weight
    if rare and len(y):
        classes, counts = torch.unique(y, return_counts=True)
        med = counts.float().median()
        per_class = (med / counts.float()).clamp(1.0, 10.0)
        w *= per_class[torch.searchsorted(classes, y)]
    return w


@torch.no_grad()
def model_logits(model, x: torch.Tensor, chunk: int = 256) -> torch.Tensor:
    """`model`'s eval-mode outputs on `x` (on the CPU), `chunk` rows at a time; its mode restored."""
    was = model.training
    model.eval()
    dev = next(model.parameters()).device
    out = torch.cat([model(x[i:i + chunk].to(dev)).cpu() for i in range(0, len(x), chunk)])
    model.train(was)
    return out


# -- the method --------------------------------------------------------------------------------
class Replay(Method):
    needs = ("xy",)  # (x, y) tensor batches of a classification-like task (assemble.check_methods_fit)
    dicts = True  # ... or token batches: dicts of tensors with a per-token target
    target = None  # a dict batch's target key (task.target), when the config names one
    tokens = False  # per-token targets (a language model): set from the data

    def __init__(self, cfg, run, trained=None):
        if run.distributed.strategy != "none":
            raise ConfigError("methods.replay: one process only for now (its replay rows are a second forward "
                              "pass in the step); use distributed.strategy=none")
        self.key, self.cfg, self.seed = "replay", cfg, run.seed
        self.target = getattr(getattr(run, "task", None), "target", None)  # a dict batch's target key, if named
        self.tokens = False  # per-token targets (a language model): set from the data by the data hook
        self.from_path = exported_file(cfg.from_, "methods.replay.from") if cfg.from_ else None
        self.buffer = load_buffer(self.from_path) if self.from_path else None
        self.digest = file_digest(self.from_path) if self.from_path else None
        self.rows = 0  # replay rows per step, set from the batch size by the data hook
        self._dev: Optional[tuple[torch.Tensor, ...]] = None  # the buffer on the model's device
        self._cache = (None, None)  # (the new rows' outputs, the replay logits computed with them)
        self.report: dict = {}
        self.filled: Optional[torch.Tensor] = None  # logits computed for a `from` buffer that had none
        self._dev_logits: Optional[torch.Tensor] = None  # the stored logits on the model's device
        if cfg.logits and self.buffer is not None and len(self.buffer) and self.buffer.logits is None:
            self.needs = ("xy", "init")  # the stored logits come from the model the run starts from

    def on_fit_start(self, state):
        if not self.cfg.logits or self.buffer is None or not len(self.buffer):
            return
        bare = state.dist.unwrap(state.model)
        if self.buffer.logits is None:  # a new run: the model still holds the previous version's weights
            with FlopCounterMode(display=False) as counter:
                self.filled = model_logits(bare, self.buffer.x).float()
            state.add_flops(float(counter.get_total_flops()), "replay.logits")
            self.buffer.logits = self.filled
        width = tuple(model_logits(bare, self.buffer.x[:1]).shape[1:])
        if width != tuple(self.buffer.logits.shape[1:]):
            raise ConfigError(f"methods.replay.logits: the buffer's stored logits are {tuple(self.buffer.logits.shape[1:])} "
                              f"per example but this model's are {width}; replay logits of the same head")

    def _check_tokens(self, y0: torch.Tensor) -> None:
        self.tokens = y0.ndim >= 2  # [1, T]: a target per position
        if not self.tokens:
            return
        c = self.cfg
        odd = "logits" if c.logits else "hard_weight" if c.hard_weight != 1.0 else "rare_weight" if c.rare_weight else None
        if odd is not None:
            raise ConfigError(f"methods.replay.{odd}: a classifier's setting (per class or per example logits); this "
                              "data's targets are per token (a language model): drop it")
        if self.buffer is not None and len(self.buffer) and self.buffer.y.ndim < 2:
            raise CheckpointError(f"methods.replay.from: {self.from_path}: a classifier's buffer (one label per "
                                  "example); this data's targets are per token")

    def data(self, source, sampler):
        batch = getattr(sampler, "batch_size", None)
        x0, y0 = token_rows(source.take(torch.tensor([0])), self.target)
        self._check_tokens(y0)
        if self.buffer is not None and len(self.buffer):
            if tuple(self.buffer.x.shape[1:]) != tuple(x0.shape[1:]):
                raise CheckpointError(f"methods.replay.from: {self.from_path}: the buffer's examples have shape "
                                      f"{tuple(self.buffer.x.shape[1:])} but this data's {tuple(x0.shape[1:])}")
            if batch is None:
                raise ConfigError("methods.replay: the sampler has no batch_size; replay needs fixed-size batches")
            self.rows = max(1, round(batch * self.cfg.ratio / (1 - self.cfg.ratio)))
            self.rows = min(self.rows, len(self.buffer))
        return source, sampler

    # -- per step --------------------------------------------------------------------------
    def replay_indices(self, epoch: int, batch_in_epoch: int) -> torch.Tensor:
        """The buffer rows replayed by batch `batch_in_epoch` of `epoch`: a function of (seed, epoch, batch)."""
        n = len(self.buffer)
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch + 7_919)  # not the sampler's stream
        perm = torch.randperm(n, generator=g)
        start = (batch_in_epoch * self.rows) % n
        return perm[torch.arange(start, start + self.rows) % n]

    def replay_batch(self, state) -> Optional[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """This step's replay rows (x, y, weight) on the model's device, or None without a buffer."""
        if not self.rows:
            return None
        if self._dev is None or not same_device(self._dev[0].device, state.device, current_index(state.device)):
            self._dev = tuple(t.to(state.device) for t in (self.buffer.x, self.buffer.y, self.buffer.weight))
        idx = self.replay_indices(state.epoch, state.batch_in_epoch).to(state.device)
        return tuple(t.index_select(0, idx) for t in self._dev)

    def replay_logits(self, state, outputs) -> Optional[torch.Tensor]:
        """The model's logits on this step's replay rows, computed once per micro-batch (LwF reuses them)."""
        if self._cache[0] is outputs:
            return self._cache[1]
        rb = self.replay_batch(state)
        logits = None if rb is None else logits_of(state.model(rb[0]))
        self._cache = (outputs, logits)
        return logits

    def loss_terms(self, batch, outputs, state):
        # every micro-batch replays the step's whole replay batch; the Objective scales each term by
        # the micro-batch's share, so a step counts CE(replay) once, however it is accumulated
        logits = self.replay_logits(state, outputs)
        if logits is None:
            return {}
        _, y, w = self.replay_batch(state)
        if y.ndim >= 2:  # per-token targets: each row's target tokens weighted by its weight
            ce = F.cross_entropy(logits.float().flatten(0, -2), y.reshape(-1), ignore_index=IGNORE,
                                 reduction="none").view(y.shape)
            rw = w.view(-1, *([1] * (y.ndim - 1))) * (y != IGNORE)
            return {"replay": self.cfg.weight * (ce * rw).sum() / rw.sum().clamp_min(1e-12)}
        ce = F.cross_entropy(logits.float(), y, reduction="none")
        terms = {"replay": self.cfg.weight * (ce * w).sum() / w.sum()}
        if self.cfg.logits and self.buffer.logits is not None:
            terms["replay_logits"] = self.cfg.logit_weight * F.mse_loss(logits.float(), self.stored_logits(state))
        return terms

    def stored_logits(self, state) -> torch.Tensor:
        """The stored logits of this step's replay rows (the rows of `replay_batch`), on the model's device."""
        if self._dev_logits is None or not same_device(self._dev_logits.device, state.device, current_index(state.device)):
            self._dev_logits = self.buffer.logits.to(state.device)
        idx = self.replay_indices(state.epoch, state.batch_in_epoch).to(state.device)
        return self._dev_logits.index_select(0, idx)

    # -- the next version's buffer -----------------------------------------------------------
    @torch.no_grad()
    def finalize(self, model, data):
        new = data.train
        _, y0 = token_rows(new.take(torch.tensor([0])), self.target)
        self._check_tokens(y0)
        if self.tokens:
            return self._finalize_tokens(new)
        nx, ny = new.take(torch.arange(len(new)))
        old = self.buffer or Buffer(nx[:0].float(), ny[:0].long(), torch.zeros(0), 0)
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + old.seen + 104_729)
        if self.cfg.selection == "reservoir":
            n = min(self.cfg.size, len(old) + len(ny))
            x, y = nx.new_zeros((n, *nx.shape[1:]), dtype=torch.float32), ny.new_zeros(n)
            x[:len(old)], y[:len(old)] = old.x, old.y
            slots, picks = reservoir(len(old), old.seen, len(ny), self.cfg.size, g)
            x[slots], y[slots] = nx[picks].float(), ny[picks]
            origin = torch.arange(n).masked_fill(torch.arange(n) >= len(old), -1)  # the old row each row is, or -1
            origin[slots] = -1
        else:
            px, py = torch.cat([old.x, nx.float()]), torch.cat([old.y, ny])
            keep = balanced(py, self.cfg.size, g)
            x, y = px[keep], py[keep]
            origin = keep.masked_fill(keep >= len(old), -1)
        wrong = self._wrong(model, x, y) if self.cfg.hard_weight != 1.0 else torch.zeros(len(y), dtype=torch.bool)
        w = example_weights(y, wrong, self.cfg.hard_weight, self.cfg.rare_weight)
        logits = self._stored_logits(model, x, origin, old.logits) if self.cfg.logits else None
        self.buffer = Buffer(x.contiguous(), y.contiguous(), w, old.seen + len(ny), logits)
        classes, counts = torch.unique(y, return_counts=True)
        self.report = {"buffer": len(y), "seen": self.buffer.seen, "rows_per_step": self.rows,
                       "per_class": {str(int(c)): int(n) for c, n in zip(classes, counts)},
                       "hard": int(wrong.sum())}
        if logits is not None:
            self.report["logits"] = True

    def _finalize_tokens(self, new) -> None:
        """The next version's buffer of token windows: a uniform sample of every window seen, only the
        chosen windows read from the data."""
        old = self.buffer
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + (old.seen if old else 0) + 104_729)
        old_n, seen = (len(old), old.seen) if old else (0, 0)
        slots, picks = reservoir_vectorised(old_n, seen, len(new), self.cfg.size, g)
        order = picks.argsort()  # read the data in its own order (a memory-mapped file: forward)
        nx, ny = token_rows(new.take(picks[order]), self.target) if len(picks) else (None, None)
        n = min(self.cfg.size, old_n + len(new))
        shape = tuple(old.x.shape[1:]) if old else tuple(nx.shape[1:])
        x = torch.zeros((n, *shape), dtype=torch.long)
        y = torch.full((n, *shape), IGNORE, dtype=torch.long)
        if old:
            x[:old_n], y[:old_n] = old.x[:n], old.y[:n]
        if nx is not None:
            x[slots[order]], y[slots[order]] = nx.long(), ny.long()
        self.buffer = Buffer(x.contiguous(), y.contiguous(), torch.ones(n), seen + len(new))
        self.report = {"buffer": n, "seen": self.buffer.seen, "rows_per_step": self.rows, "tokens": True,
                       "added": len(picks)}

    @staticmethod
    def _wrong(model, x, y) -> torch.Tensor:
        return model_logits(model, x).argmax(-1) != y

    @staticmethod
    def _stored_logits(model, x, origin: torch.Tensor, old: Optional[torch.Tensor]) -> torch.Tensor:
        """The final model's logits on the rows it adds; the rows carried over keep theirs (DER: the
        logits of the model that stored them)."""
        out = model_logits(model, x).float()
        kept = origin >= 0
        if old is not None and kept.any() and old.shape[1:] == out.shape[1:]:
            out[kept] = old[origin[kept]]
        return out.contiguous()

    def export(self, model):
        return self.buffer.tensors() if self.buffer is not None else None

    def summary(self) -> dict:
        return self.report or ({"buffer": len(self.buffer), "rows_per_step": self.rows} if self.buffer else {})

    def state_dict(self) -> dict:
        # the buffer is read-only while training: it is `from`'s file, whose digest a resume checks
        sd = {"from_digest": self.digest}
        if self.filled is not None:  # logits the starting model gave a `from` buffer: a resumed model cannot redo them
            sd["logits"] = self.filled
        return sd

    def load_state_dict(self, sd: dict) -> None:
        check_pinned(sd, "from_digest", self.digest, "methods.replay.from", self.from_path, "the buffer")
        if "logits" in sd and self.buffer is not None:
            self.filled = self.buffer.logits = sd["logits"].float()
