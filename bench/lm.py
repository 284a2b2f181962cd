"""Language models end to end (issue 50, the model side): GPT-2, Llama and Qwen2 built from their
`transformers` configs (random weights) and the built-in nanoGPT module (tied embeddings) trained on
the `text` source through recipes/lm_small.yaml, each killed by SIGKILL and resumed; then ecotrain's
tokens per second against a hand-written nanoGPT-style loop on the same model and batch.

    python bench/lm.py [--quick]

1. Each model trains `steps` steps through the real CLI (`ecotrain fit recipes/lm_small.yaml
   model.name=... model.kwargs=...`), a checkpoint every `every` steps: once whole, once killed by
   SIGKILL at the end of step `kill` (after a checkpoint, before the next) and continued with
   `ecotrain resume`. A model is OK when its logged training loss falls (last log interval below the
   first) and the resumed run's model.safetensors equals the whole run's byte for byte.
2. tokens/s: inside one `fit` of the nanoGPT model (Python API, no validation, ledger on as by
   default), a hand-written loop (nanoGPT's train.py: get_batch, forward, cross-entropy, backward,
   clip, AdamW step, zero_grad) trains its own copy of the same model on batches of the same shape,
   one of its steps after each of ecotrain's (a callback), each timed from the end of the other's
   step to the end of its own: both loops see the same machine at the same moment (this VM's speed
   swings within a minute). Both use the optimizer kernel ecotrain picked (fused AdamW on CPU), so
   the ratio is the loop's own cost. Per round: hand-written seconds / ecotrain seconds for the
   same steps (= ecotrain tokens/s over hand-written tokens/s); the RESULT is the median of rounds.
3. ppl_test: the test perplexity of recipes/lm_small.yaml as shipped (--quick: the nanoGPT run's).
4. recipe_dict_dataset, budget_fill: a recipe whose data is this file's `StdlibDicts` (a user
   Dataset of dict items {input_ids, labels}, per-token labels) trains nanoGPT
   through `ecotrain fit` under `memory.budget`; true when it exits 0 and its loss falls;
   budget_fill is the chosen plan's measured peak (training or evaluation, the larger) over the budget
   (memory_plan.json).
5. forgetting_ppl_ratio: `ecotrain update RUN text data.kwargs.offset=5000000` (another part of the
   stdlib's source) from the shipped recipe's run (--quick: the nanoGPT run), with replay (its buffer
   sampled from the base's corpus) and LwF: the old corpus's validation perplexity after / before
   (the version's metrics). Without --quick, the same update without methods is printed too
   (forgetting_ppl_ratio_naive).
6. export_parity_max: `ecotrain export` of each model's whole run to .pt2 and ONNX (with the onnx extra):
   the largest absolute logit difference against the eager model, over the test split and the other
   sequence lengths and batch sizes export checks (1 token, about half the window; export.json).

Ends with `RESULT models_ok=K/N tied_resume_identical=true|false ppl_test=... tokens_per_s_vs_hand=...
tokens_per_s=... flops_per_token=... recipe_dict_dataset=true|false budget_fill=... forgetting_ppl_ratio=... export_parity_max=... generate_tokens_per_s_vs_nocache=... generate_same_text=true|false`
(generation: `generation`, lm_small's GPT-2 continuing a 32-token prompt by 96 tokens, with transformers'
KV cache and with one pass over the window per token, interleaved rounds, the median ratio). `--quick`: the nanoGPT model alone, tiny schedules, one round,
no run of the shipped recipe (the figures then only show that the bench runs).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import yaml

from ecotrain import Config, fit
from ecotrain.callbacks import Callback

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "lm_small.yaml"
SIZE = {"d_model": 64, "n_layers": 2, "n_heads": 4}
MODELS = {  # name -> the recipe's `model:`, tiny; the tied ones: gpt2 (its default) and nanogpt
    "gpt2": {"name": "causal_lm", "kwargs": {"arch": "gpt2", **SIZE}},
    "llama": {"name": "causal_lm", "kwargs": {"arch": "llama", **SIZE, "n_kv_heads": 2}},
    "qwen2": {"name": "causal_lm", "kwargs": {"arch": "qwen2", **SIZE, "n_kv_heads": 2}},
    "nanogpt": {"name": "nanogpt", "kwargs": dict(SIZE)},
}
TIED = ("gpt2", "nanogpt")
QUICK = ("nanogpt",)  # --quick: the built-in model alone (no transformers import per run)


class KillOnce(Callback):
    """SIGKILL this process at the end of step `step` (before that step's checkpoint), unless `marker`
    exists; it is made first, so the resumed run, with the same config, trains past the step."""

    def __init__(self, step: int, marker: str):
        self.step, self.marker = step, Path(marker)

    def on_step_end(self, state):
        if state.step == self.step and not self.marker.exists():
            self.marker.touch()
            os.kill(os.getpid(), signal.SIGKILL)


def ecotrain(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "bench"), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "ecotrain", *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1800)


def one_model(name: str, root: Path, steps: int, every: int, kill: int, max_bytes: int) -> dict:
    recipe = root / f"{name}.yaml"  # lm_small with this model (an override would merge the kwargs)
    tree = yaml.safe_load(RECIPE.read_text())
    recipe.write_text(f"# ecotrain fit {recipe.name}\n" + yaml.safe_dump({**tree, "model": MODELS[name]}))
    marker = root / f"{name}.killed"
    common = [f"loop.max_steps={steps}", "loop.log_every=5",
              f"loop.eval_every={steps}", f"checkpoint.every_n_steps={every}", f"data.kwargs.max_bytes={max_bytes}",
              "schedule.warmup=5", "ledger.energy=off",
              f"callbacks=[{{path: 'lm:KillOnce', kwargs: {{step: {kill}, marker: '{marker}'}}}}]"]
    marker.touch()  # the whole run: never killed
    whole = ecotrain("fit", recipe, *common, "--run-dir", root / f"{name}-whole", "--quiet")
    marker.unlink()
    cut = ecotrain("fit", recipe, *common, "--run-dir", root / f"{name}-cut", "--quiet")
    resumed = ecotrain("resume", root / f"{name}-cut", "--quiet")
    out = {"name": name, "whole_rc": whole.returncode, "cut_rc": cut.returncode, "resume_rc": resumed.returncode}
    if whole.returncode or cut.returncode != -signal.SIGKILL or resumed.returncode:
        out["error"] = (whole.stderr or resumed.stderr).strip().splitlines()[-1:] or ["no stderr"]
        return {**out, "loss_falls": False, "resume_identical": False}
    losses = [r["loss"] for r in map(json.loads, (root / f"{name}-whole" / "metrics.jsonl").read_text().splitlines())
              if "loss" in r]
    a, b = (root / d / "model.safetensors" for d in (f"{name}-whole", f"{name}-cut"))
    s = json.loads((root / f"{name}-whole" / "summary.json").read_text())
    return {**out, "loss_first": losses[0], "loss_last": losses[-1], "loss_falls": losses[-1] < losses[0],
            "resume_identical": a.read_bytes() == b.read_bytes(), "test_perplexity": s["test_perplexity"]}


class HandLoop(Callback):
    """A nanoGPT-style loop on its own copy of the model, one step after each of ecotrain's."""

    def __init__(self, make_model, rows: torch.Tensor, batch: int, lr: float, seed: int = 1):
        torch.manual_seed(seed)
        self.model = make_model()
        self.rows, self.batch = rows, batch
        self.gen = torch.Generator().manual_seed(seed)
        self.lr = lr
        self.eco, self.hand = [], []
        self._t = None

    def on_fit_start(self, state):
        kind = {k: v for k, v in state.optimizer.defaults.items() if k in ("fused", "foreach")}  # ecotrain's kernel
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=self.lr, weight_decay=0.1, **kind)
        self._t = time.perf_counter()

    def get_batch(self):
        i = torch.randint(len(self.rows), (self.batch,), generator=self.gen)
        w = self.rows[i].long()
        return w[:, :-1], w[:, 1:]

    def on_step_end(self, state):
        t0 = time.perf_counter()
        self.eco.append(t0 - self._t)
        x, y = self.get_batch()
        logits = self.model(x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self._t = time.perf_counter()
        self.hand.append(self._t - t0)


def speed(rounds: int, steps: int, seq_len: int, batch: int, max_bytes: int) -> tuple[list[float], dict]:
    from ecotrain.data.text import packed_rows, read_corpus
    from ecotrain.models.nanogpt import NanoGPT

    rows = packed_rows(read_corpus(max_bytes), seq_len)
    ratios, last = [], {}
    for r in range(rounds):
        cfg = Config.model_validate({
            "name": "lm-speed", "seed": r, "data": {"name": "text", "batch_size": batch, "val_split": 0.0,
                                                    "test_split": 0.0,
                                                    "kwargs": {"seq_len": seq_len, "max_bytes": max_bytes}},
            "model": {"name": "nanogpt", "kwargs": {"d_model": 128, "n_layers": 2, "n_heads": 4}},
            "optim": {"name": "adamw", "lr": 1e-3, "weight_decay": 0.1}, "schedule": {"name": "constant"},
            "loop": {"max_steps": steps, "max_epochs": None, "grad_clip": 1.0, "log_every": 10},
            "logging": {"progress": "off"}, "ledger": {"energy": "off"}, "checkpoint": {"at_end": False,
                                                                                         "every_minutes": None}})
        hand = HandLoop(lambda: NanoGPT(256, seq_len, 128, 2, 4), rows, batch, 1e-3, seed=r)
        with tempfile.TemporaryDirectory() as tmp:
            res = fit(cfg, run_dir=Path(tmp) / "run", quiet=True, callbacks=[hand])
            ledger = json.loads((res.run_dir / "ledger.json").read_text())
        skip = min(5, steps // 4)  # the first steps: the ledger's FLOP count, allocator warm-up
        ratios.append(sum(hand.hand[skip:]) / sum(hand.eco[skip:]))
        last = {"tokens_per_s": res.summary["tokens_per_second"],
                "flops_per_token": ledger["tokens"]["flops_per_token"]}
    return ratios, last


class StdlibDicts(torch.utils.data.Dataset):
    """A user's token Dataset as a recipe names it (`lm:StdlibDicts`): windows of the stdlib's bytes as
    dict items, per-token labels (the next byte)."""

    vocab_size = 256

    def __init__(self, seq_len: int = 64, max_bytes: int = 60000):
        from ecotrain.data.text import packed_rows, read_corpus

        self.rows = packed_rows(read_corpus(max_bytes), seq_len)

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        w = self.rows[i].long()
        return {"input_ids": w[:-1], "labels": w[1:].clone()}  # nanogpt takes no [T] padding mask


def dict_recipe(root: Path, steps: int, budget: str) -> tuple[bool, float | None]:
    """(the dict-items recipe trained through the CLI and its loss fell, planned peak / memory.budget)."""
    recipe = root / "dicts.yaml"
    recipe.write_text("# ecotrain fit dicts.yaml\n" + yaml.safe_dump({
        "name": "lm-dicts", "seed": 0, "task": {"name": "language_model"},
        "data": {"name": "lm:StdlibDicts", "batch_size": 8, "val_split": 0.1, "test_split": 0.0,
                 "kwargs": {"seq_len": 64, "max_bytes": 60000}},
        "model": {"name": "nanogpt", "kwargs": dict(SIZE)}, "optim": {"lr": 3e-3},
        "loop": {"max_steps": steps, "max_epochs": None, "log_every": 5, "eval_every": steps},
        "memory": {"budget": budget}, "ledger": {"energy": "off"}}))
    r = ecotrain("fit", recipe, "--run-dir", root / "dicts", "--quiet")
    if r.returncode:
        print("dict recipe:", (r.stderr.strip().splitlines() or ["no stderr"])[-1])
        return False, None
    losses = [x["loss"] for x in map(json.loads, (root / "dicts" / "metrics.jsonl").read_text().splitlines())
              if "loss" in x]
    plan = json.loads((root / "dicts" / "memory_plan.json").read_text())
    chosen = plan["chosen"]
    peak = max(chosen["peak_bytes"], chosen.get("eval_peak_bytes") or 0)
    print(f"dict recipe: loss {losses[0]:.3f} -> {losses[-1]:.3f}; plan {chosen['plan']}: peak {peak / 2**20:.0f} MiB "
          f"of a {plan['budget_bytes'] / 2**20:.0f} MiB budget")
    return losses[-1] < losses[0], peak / plan["budget_bytes"]


def forgetting(base: Path, root: Path, steps: int, methods: str) -> float | None:
    """`ecotrain update BASE text data.kwargs.offset=5000000` (a shifted corpus): the old corpus's
    validation perplexity after / before, from the printed line."""
    r = ecotrain("update", base, "text", "data.kwargs.offset=5000000", f"loop.max_steps={steps}",
                 f"loop.eval_every={steps}", "ledger.energy=off", f"methods={methods}", "callbacks=[]",
                 "--registry", root / f"registry-{len(list(root.glob('registry-*')))}")
    lines = r.stdout.strip().splitlines()
    print(f"update ({methods}): rc {r.returncode}; " + " | ".join(lines[:3]) if lines else
          f"update: {(r.stderr.strip().splitlines() or ['no output'])[-1]}")
    found = [w for line in lines for w in line.split() if w.startswith("forgetting_ppl_ratio=")]
    return float(found[0].split("=")[1]) if found else None


def export_parity(root: Path, names: list[str]) -> float | None:
    """`ecotrain export` of each trained model (its `-whole` run) to .pt2 and, with the onnx extra, ONNX:
    the largest absolute logit difference of any export against the eager model, over the test split and
    the other sequence lengths export checks (docs/lm.md); None when an export failed."""
    formats = ["pt2"] + (["onnx"] if all(importlib.util.find_spec(m) for m in ("onnx", "onnxscript")) else [])
    worst = 0.0
    for name in names:
        for fmt in formats:
            out = root / "exports" / name / f"model.{fmt}"
            out.parent.mkdir(parents=True, exist_ok=True)
            r = ecotrain("export", root / f"{name}-whole", "--format", fmt, "--out", out, "--no-card")
            if r.returncode:
                print(f"export {name} {fmt}: {(r.stderr.strip().splitlines() or ['no output'])[-1]}")
                return None
            rec = json.loads((out.parent / "export.json").read_text())["files"][out.name]
            print(f"export {name} {fmt}: max abs logit diff {rec['max_abs_diff']:.3g} (lengths {', '.join(rec['lengths'])} "
                  f"and the test split's)")
            worst = max(worst, rec["max_abs_diff"])
    return worst


def generation(rounds: int, new_tokens: int) -> tuple[float, bool]:
    """(median tokens/s with transformers' KV cache over tokens/s with one pass over the window per token,
    the same greedy tokens both ways) on lm_small's GPT-2 (random weights: speed does not depend on them),
    a 32-token prompt, interleaved rounds, one thread."""
    from types import SimpleNamespace

    import torch

    from ecotrain.export.generate import Decoding, LanguageModel, continue_prompt
    from ecotrain.models.causal_lm import causal_lm

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = causal_lm("gpt2", vocab_size=256, max_len=128, d_model=128, n_layers=2, n_heads=4).eval()
    lm = LanguageModel(model, 128, 256, SimpleNamespace(eod=None), "lm_small", cached=model.hf)
    prompt, how = list(range(40, 72)), Decoding(max_new_tokens=new_tokens)
    ratios, same = [], True
    for _ in range(rounds):
        t0 = time.perf_counter()
        a = continue_prompt(lm, prompt, how)
        t1 = time.perf_counter()
        b = continue_prompt(lm, prompt, how, use_cache=False)
        t2 = time.perf_counter()
        ratios.append((t2 - t1) / (t1 - t0))  # tokens/s with the cache over without: the same tokens each
        same = same and a == b
    return statistics.median(ratios), same


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="tiny schedules, one round: checks the bench runs")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    quick = args.quick
    steps, every, kill, max_bytes = (12, 4, 6, 60000) if quick else (40, 10, 25, 200000)
    with tempfile.TemporaryDirectory() as tmp:
        rows = [one_model(n, Path(tmp), steps, every, kill, max_bytes) for n in (QUICK if quick else MODELS)]
        if quick:  # no run of the shipped recipe: the one model's test perplexity
            ppl = rows[0].get("test_perplexity")
        else:
            shipped = ecotrain("fit", RECIPE, "--run-dir", Path(tmp) / "shipped", "--quiet", "ledger.energy=off")
            ppl = (json.loads((Path(tmp) / "shipped" / "summary.json").read_text())["test_perplexity"]
                   if shipped.returncode == 0 else None)
        dicts_ok, fill = dict_recipe(Path(tmp), 10 if quick else 40, "1GiB")
        base = Path(tmp) / ("nanogpt-whole" if quick else "shipped")
        protect = "[{name: replay, size: 64}, {name: lwf}]"
        ratio = forgetting(base, Path(tmp), 10 if quick else 100, protect)
        naive = None if quick else forgetting(base, Path(tmp), 100, "[]")
        parity = export_parity(Path(tmp), [r["name"] for r in rows])
    for r in rows:
        print(f"{r['name']:8s} loss {r.get('loss_first', float('nan')):.3f} -> {r.get('loss_last', float('nan')):.3f} "
              f"falls={r['loss_falls']} resume_identical={r['resume_identical']} "
              f"test_ppl={r.get('test_perplexity', float('nan')):.2f} {r.get('error', '')}")
    ratios, last = speed(1 if quick else args.rounds, 20 if quick else 200, 64 if quick else 128, 8 if quick else 16,
                         60000 if quick else 400000)
    print("tokens/s ratio per round (ecotrain / hand-written):", " ".join(f"{x:.3f}" for x in ratios))
    gen_ratio, gen_same = generation(1 if quick else 5, 16 if quick else 96)
    ok = sum(r["loss_falls"] and r["resume_identical"] for r in rows)
    tied = all(r["resume_identical"] for r in rows if r["name"] in TIED)
    print(f"RESULT models_ok={ok}/{len(rows)} tied_resume_identical={str(tied).lower()} "
          f"ppl_test={ppl if ppl is None else f'{ppl:.3f}'} tokens_per_s_vs_hand={statistics.median(ratios):.3f} "
          f"tokens_per_s={last['tokens_per_s']:.0f} flops_per_token={last['flops_per_token']:.4g} "
          f"recipe_dict_dataset={str(dicts_ok).lower()} budget_fill={fill if fill is None else f'{fill:.3f}'} "
          f"forgetting_ppl_ratio={ratio if ratio is None else f'{ratio:.4f}'}"
          f" export_parity_max={parity if parity is None else f'{parity:.3g}'}"
          f" generate_tokens_per_s_vs_nocache={gen_ratio:.2f} generate_same_text={str(gen_same).lower()}"
          + ("" if quick else f" forgetting_ppl_ratio_naive={naive if naive is None else f'{naive:.4f}'}"))


if __name__ == "__main__":
    main()
