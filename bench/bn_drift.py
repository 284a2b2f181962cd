"""BatchNorm drift when fine-tuning, in three settings, and every `batchnorm` policy on them
(docs/finetuning.md). The settings `tiny` and `few`, the shift and the drift criterion below were
fixed before any policy's result was looked at; `short` was added afterwards (see below).

The data: the 1-D ResNet (BatchNorm) pre-trained on MNIST-1D; a new domain, a recording condition
with a fixed gain and offset (x -> 2 x + 1, the signals' std is about 1); the fine-tuning set is 200
new-domain samples (plus 50 for validation) drawn from a fresh MNIST-1D set (another generator
seed: samples the model has never seen). Tests: the original test split (domain `original`) and the
same split shifted (domain `shifted`).

Setting `tiny` (how user feedback arrives): batches of 4 samples that each come from ONE class (a
bench-local `OneClassBatches` method replaces the sampler: within each class a seeded order cut into
batches of 4, the batches then shuffled; a function of (seed, epoch)), BN momentum at its default
0.1, 4 epochs (200 steps), AdamW lr 3e-4.

Setting `few` (a quick adaptation, then serving everyone): 10 steps of i.i.d. batches of 16 on the
new domain, lr 3e-4, then inference on a mixed stream: the original and the shifted test splits in
one .npz with a `domain` column (`ecotrain eval --data mixed.npz` routes each row to its domain's
statistics under `policy: domain`; other policies serve one set of statistics to every row).

Setting `short` (added after the first two): `few` with 3 fine-tuning steps instead of 10, all else
the same. Chosen by looking at the naive fine-tune only, after `tiny` and `few` had been run with
every policy: a naive-only probe (validation, design seeds) of the eval-below-train gap on the new
domain gave +4.8 points after 3 steps, +0.7 after 5, -2.0 after 10 (running statistics at momentum
0.1 have moved only 1 - 0.9^3 = 27% of the way to the new domain after 3 steps, while train mode
uses the batch's own). No policy's result in this setting was looked at before it was fixed, and
`tiny` and `few` were not changed. The drift criterion is the same as for the other settings.

The drift criterion (per setting, naive fine-tuning = `policy: train`, fresh seeds): the gap, train
mode minus eval mode accuracy on the new domain's validation split, train mode meaning BN on the
statistics of batches formed as in fine-tuning (one class per batch of 4 in `tiny`, random batches of
16 in `few`; dropout off); drift_reproduced when the gap's mean is at least 0.05 and its 95% interval
lies above 0, or when the eval-mode accuracy on the new domain's test split is at least 0.05 below
the pre-trained model's.

The policies: train (naive), freeze_stats, recompute, momentum 0.01, domain (running statistics of
the new domain; the original domain served with the pre-trained ones) and domain+recompute (the new
domain's statistics recomputed on its data at the end). Under the evaluation protocol
(docs/evaluation.md): the policy is chosen on validation data over the design seeds (the best mean
new-domain validation accuracy, over all settings, among the policies whose original-domain
validation accuracy, on the pre-training run's validation split, stays within 2 points of the
pre-trained model's in every setting; when none does, among all policies); the test figures are
reported once, on the fresh seeds: mean and 95% interval, gains paired by seed. With `short` added
this rule was extended from "both settings" to all three as it stands (one policy for the whole
bench, not one per setting; decided before any policy was run in `short`), so the chosen policy,
and with it the best_* figures of `tiny` and `few`, may differ from the two-setting run's.

    python bench/bn_drift.py [--design-seeds 0-2] [--fresh-seeds 10-14] [--work DIR] [--quick]

`--quick` (a check that the bench runs, not a figure): 400 pre-training samples, widths 8,8,8, one
epoch, seeds 0 and 10, three policies (train, recompute, domain).

Ends with one `RESULT` line: per setting (suffix _tiny, _few, _short) drift_reproduced, naive_eval_train_gap
(with _ci_low/_ci_high), best_gain_over_naive (with its interval), original_drop (of the best
policy), domain_gain_over_naive, domain_original_drop; and best_policy, design_seeds, fresh_seeds.
"""

from __future__ import annotations

import argparse
import atexit
import copy
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import yaml

os.environ.setdefault("ECOTRAIN_CACHE", str(Path(tempfile.gettempdir()) / "ecotrain-bench-cache"))

from ecotrain import Config, fit  # noqa: E402
from ecotrain.data import load_data  # noqa: E402
from ecotrain.export.inference import evaluate, load_trained  # noqa: E402
from ecotrain.methods import Method  # noqa: E402
from ecotrain.methods.batchnorm import bn_layers  # noqa: E402
from ecotrain.base.stats import mean_ci  # noqa: E402
from ecotrain.seeds.sweep import parse_seeds  # noqa: E402

POLICIES = {
    "train": {"policy": "train"},
    "freeze_stats": {"policy": "freeze_stats"},
    "recompute": {"policy": "recompute"},
    "momentum=0.01": {"policy": "momentum", "momentum": 0.01},
    "domain": {"policy": "domain", "domain": "shifted"},
    "domain+recompute": {"policy": "domain", "domain": "shifted", "domain_stats": "recompute"},
}
SETTINGS = {  # tiny, few: fixed before any policy was run; short: from a naive-only probe (docstring)
    "tiny": {"batch_size": 4, "one_class": True, "loop": {"max_epochs": 4}},
    "few": {"batch_size": 16, "one_class": False, "loop": {"max_steps": 10, "max_epochs": None}},
    "short": {"batch_size": 16, "one_class": False, "loop": {"max_steps": 3, "max_epochs": None}},  # added later
}
COMMON = {"logging": {"progress": "off"}, "ledger": {"energy": "off"}, "checkpoint": {"at_end": False}}
SCALE, OFFSET = 2.0, 1.0


class OneClassSampler:
    """Batches of `batch_size` indices of one class each: per class a seeded order cut into batches,
    then every batch in a seeded order; a function of (seed, epoch), like the built-in sampler."""

    def __init__(self, labels: torch.Tensor, batch_size: int, seed: int):
        self.labels, self.batch_size, self.seed = labels, batch_size, seed

    def _all(self, epoch: int) -> list[torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        out = []
        for c in self.labels.unique().tolist():
            members = torch.nonzero(self.labels == c).flatten()
            out += list(members[torch.randperm(len(members), generator=g)].split(self.batch_size))
        return [out[i] for i in torch.randperm(len(out), generator=g).tolist()]

    def __len__(self) -> int:
        return len(self._all(0))

    def batches(self, epoch: int, start: int = 0):
        return self._all(epoch)[start:]


class OneClassBatches(Method):
    """The bench's feedback-like batches: the data hook swaps the sampler for OneClassSampler."""

    key = "one_class_batches"

    def __init__(self, seed: int):
        self.seed = seed

    def data(self, source, sampler):
        return source, OneClassSampler(source.labels(), sampler.batch_size, self.seed)


def shift(x) -> np.ndarray:
    return (np.asarray(x) * SCALE + OFFSET).astype(np.float32)


@torch.no_grad()
def train_mode_accuracy(run: Path, x: torch.Tensor, y: torch.Tensor, batches: list[torch.Tensor]) -> tuple[float, float]:
    """(eval-mode, train-mode) accuracy of a run's saved model on (x, y); train mode: BN on the statistics
    of `batches` (as fine-tuning formed them), dropout off, on a copy (the running statistics untouched)."""
    model = load_trained(run, "cpu").model.eval()
    eval_acc = float((model(x).argmax(-1) == y).float().mean())
    trained = copy.deepcopy(model)
    for m in bn_layers(trained).values():
        m.train()
    right = sum(int((trained(x[b]).argmax(-1) == y[b]).sum()) for b in batches)
    return eval_acc, right / len(y)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--num-samples", type=int, default=4000, help="MNIST-1D size of the pre-training set")
    ap.add_argument("--widths", default="32,64,128", help="ResNet stage widths")
    ap.add_argument("--pretrain-epochs", type=int, default=6)
    ap.add_argument("--design-seeds", default="0-2", help="fine-tuning seeds the policy is chosen on (validation)")
    ap.add_argument("--fresh-seeds", default="10-14", help="fine-tuning seeds the test figures are reported on")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest on 2 shared cores)")
    ap.add_argument("--work", help="folder for the runs (default: a temporary folder)")
    ap.add_argument("--decide", metavar="SEEDS", help="only the headline, decided (bench/decisive.py): in `short`, "
                    "the chosen policy (recompute) against naive from these fresh seeds on, one seed more per look "
                    "until the gain's sequential interval is wholly above 0.03 (PASS) or below it (FAIL)")
    ap.add_argument("--max-seeds", type=int, default=20, help="with --decide: at most this many seeds")
    ap.add_argument("--quick", action="store_true", help="tiny sizes, one seed each, three policies: checks the bench runs")
    args = ap.parse_args()
    if args.quick:
        args.num_samples, args.widths, args.pretrain_epochs = 400, "8,8,8", 1
        args.design_seeds, args.fresh_seeds = "0", "10"
        for label in ("freeze_stats", "momentum=0.01", "domain+recompute"):
            del POLICIES[label]
    torch.set_num_threads(args.threads)
    work = Path(args.work or tempfile.mkdtemp(prefix="bn_drift-"))
    if args.quick and not args.work:
        atexit.register(shutil.rmtree, work, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    model = {"name": "resnet", "kwargs": {"widths": [int(w) for w in args.widths.split(",")]}}
    t0 = time.perf_counter()

    # 1. pre-train
    pre_cfg = Config.model_validate({
        "name": "pretrain", "data": {"name": "mnist1d", "num_samples": args.num_samples, "batch_size": 64},
        "model": model, "optim": {"lr": 3e-3, "weight_decay": 1e-4}, "schedule": {"name": "cosine"},
        "loop": {"max_epochs": args.pretrain_epochs, "log_every": 1000}, **COMMON})
    pre = work / "pretrain"
    if not (pre / "model.safetensors").is_file() or (pre / "config.yaml").read_text() != yaml.safe_dump(
            pre_cfg.to_dict(), sort_keys=False):  # --work reused with the same pre-training: keep it
        fit(pre_cfg, run_dir=pre, quiet=True, overwrite=True)
    print(f"pre-trained in {time.perf_counter() - t0:.0f}s", file=sys.stderr)

    # 2. the domains: original and shifted test splits, a mixed stream of both, a fresh set to fine-tune on
    pre_data = load_data(pre_cfg)
    test, pre_val = pre_data.test, pre_data.val
    fresh = load_data(Config.model_validate({"data": {"name": "mnist1d", "num_samples": 1250,
                                                      "kwargs": {"seed": 7}}})).train
    pick = torch.randperm(len(fresh), generator=torch.Generator().manual_seed(0))[:250]
    fx, fy = fresh.take(pick)
    files = {k: work / f"{k}.npz" for k in ("finetune", "original_test", "shifted_test", "mixed_test", "original_val")}
    np.savez(files["finetune"], x=shift(fx), y=fy.numpy(), x_test=shift(test.x), y_test=test.y.numpy())
    np.savez(files["original_test"], x=test.x.numpy(), y=test.y.numpy())
    np.savez(files["shifted_test"], x=shift(test.x), y=test.y.numpy())
    np.savez(files["mixed_test"], x=np.concatenate([test.x.numpy(), shift(test.x)]),
             y=np.concatenate([test.y.numpy()] * 2), domain=np.array(["original"] * len(test) + ["shifted"] * len(test)))
    np.savez(files["original_val"], x=pre_val.x.numpy(), y=pre_val.y.numpy())

    def acc(run, name, domain=None):
        return evaluate(run, [str(files[name])], out=run / f"eval-{name}.json", domain=domain)[0]["accuracy"]
    base = {k: acc(pre, k) for k in ("original_test", "shifted_test", "mixed_test", "original_val")}

    # 3. fine-tune under each policy in each setting: design seeds (validation), then fresh seeds (test)
    design_seeds, fresh_seeds = parse_seeds(args.design_seeds), parse_seeds(args.fresh_seeds)
    if set(design_seeds) & set(fresh_seeds):
        sys.exit("bench/bn_drift.py: --fresh-seeds must be disjoint from --design-seeds (docs/evaluation.md)")

    def finetune(setting: str, label: str, seed: int, final: bool) -> dict:
        st = SETTINGS[setting]
        cfg = Config.model_validate({
            "name": "finetune", "seed": seed,
            "data": {"name": "npz", "path": str(files["finetune"]), "batch_size": st["batch_size"], "val_split": 0.2},
            "model": model, "optim": {"lr": 3e-4}, "loop": {**st["loop"], "log_every": 1000},
            "methods": [{"name": "batchnorm", **POLICIES[label]}], **COMMON})
        run = work / f"{setting}-{label.replace('+', '_')}-{seed}"
        extra = [OneClassBatches(seed)] if st["one_class"] else []
        s = fit(cfg, run_dir=run, quiet=True, overwrite=True, methods=extra,
                init_from=pre / "model.safetensors").summary
        orig = "original" if POLICIES[label]["policy"] == "domain" else None  # unknown key: pre-trained statistics
        if not final:  # design: validation figures only
            return {"shifted": s["val_accuracy"], "original": acc(run, "original_val", orig)}
        out = {"shifted": s["test_accuracy"], "original": acc(run, "original_test", orig),
               "mixed": acc(run, "mixed_test")}
        if label == "train":  # the drift: eval vs train mode on the new domain's validation split
            val = load_data(cfg).val
            order = torch.randperm(len(val.y), generator=torch.Generator().manual_seed(seed))
            batches = (OneClassSampler(val.y, st["batch_size"], seed).batches(0) if st["one_class"]
                       else list(order.split(st["batch_size"])))
            ev, tr = train_mode_accuracy(run, val.x, val.y, batches)
            out.update(val_eval=ev, val_train=tr, gap=tr - ev)
        return out

    if args.decide:  # the policy was chosen on validation before (docs/finetuning.md): recompute
        from ecotrain.seeds.decide import until_decided_values

        def drop(seed: int) -> float:  # naive - recompute on the new domain's test split: minus the gain
            naive, chosen = finetune("short", "train", seed, True), finetune("short", "recompute", seed, True)
            print(f"bn seed {seed}: naive {naive['shifted']:.4f} recompute {chosen['shifted']:.4f} original "
                  f"{chosen['original']:.4f}", file=sys.stderr, flush=True)
            return naive["shifted"] - chosen["shifted"]

        d = until_decided_values(drop, parse_seeds(args.decide), args.max_seeds, -0.03)
        print(f"RESULT bn_verdict={d['verdict']} bn_seeds={','.join(map(str, d['seeds']))} bn_looks={d['looks']} "
              f"bn_forecast={d['forecast']} bn_gain_mean={-d['mean']:.4f} bn_gain_low={-d['high']:.4f} "
              f"bn_gain_high={-d['low']:.4f}")
        return 0

    design: dict = {}
    for setting in SETTINGS:
        for label in POLICIES:
            got = [finetune(setting, label, seed, False) for seed in design_seeds]
            design[(setting, label)] = {k: statistics.mean(g[k] for g in got) for k in ("shifted", "original")}
            print(f"design {setting} {label}: validation shifted {design[(setting, label)]['shifted']:.4f}, original "
                  f"{design[(setting, label)]['original']:.4f} ({time.perf_counter() - t0:.0f}s)", file=sys.stderr)
    keeps = [p for p in POLICIES if all(base["original_val"] - design[(s, p)]["original"] <= 0.02 for s in SETTINGS)]
    pool = keeps or list(POLICIES)
    best = max(pool, key=lambda p: statistics.mean(design[(s, p)]["shifted"] for s in SETTINGS))
    print(f"chosen on validation (design seeds {args.design_seeds}): {best}"
          + ("" if keeps else " (no policy kept the original-domain validation accuracy within 2 points)"))

    per_seed = {(s, p): [finetune(s, p, seed, True) for seed in fresh_seeds] for s in SETTINGS for p in POLICIES}
    print(f"fresh seeds done ({time.perf_counter() - t0:.0f}s)", file=sys.stderr)

    def cell(iv):
        return f"{iv.mean:.4f} [{iv.low:.4f}, {iv.high:.4f}]"
    print(f"MNIST-1D, ResNet widths {model['kwargs']['widths']}; pre-trained {args.pretrain_epochs} epochs on "
          f"{args.num_samples} samples; new domain x*{SCALE}+{OFFSET}; 200 fine-tuning samples (+50 validation); "
          f"test figures over fresh seeds {args.fresh_seeds}: mean [95% interval]")
    print(f"pre-trained model (test): original {base['original_test']:.4f}, shifted {base['shifted_test']:.4f}, "
          f"mixed {base['mixed_test']:.4f}; original validation {base['original_val']:.4f}")
    result = {"selected_on": "val", "design_seeds": args.design_seeds, "fresh_seeds": args.fresh_seeds,
              "best_policy": best}
    rows = {}
    for s in SETTINGS:
        naive = per_seed[(s, "train")]
        gap = mean_ci([g["gap"] for g in naive])
        below_pre = mean_ci([base["shifted_test"] - g["shifted"] for g in naive])
        drift = (gap.mean >= 0.05 and gap.low > 0) or below_pre.mean >= 0.05
        print(f"\nsetting {s}: naive validation accuracy eval mode {statistics.mean(g['val_eval'] for g in naive):.4f}, "
              f"train mode {statistics.mean(g['val_train'] for g in naive):.4f}, gap {cell(gap)}; naive shifted test "
              f"below the pre-trained model by {cell(below_pre)}: drift {'reproduced' if drift else 'not reproduced'}")
        print("| policy | new-domain acc | gain over naive | original acc | original drop | mixed-stream acc |")
        print("|---|---|---|---|---|---|")
        for p in POLICIES:
            got = per_seed[(s, p)]
            gain = mean_ci([g["shifted"] - n["shifted"] for g, n in zip(got, naive)])
            orig = mean_ci([g["original"] for g in got])
            rows[(s, p)] = {"gain": gain, "drop": base["original_test"] - orig.mean}
            print(f"| {p}{' (chosen)' if p == best else ''} | {cell(mean_ci([g['shifted'] for g in got]))} | "
                  f"{cell(gain)} | {cell(orig)} | {base['original_test'] - orig.mean:+.4f} | "
                  f"{cell(mean_ci([g['mixed'] for g in got]))} |")
        b, d = rows[(s, best)], rows[(s, "domain")]
        met = b["gain"].mean >= 0.03 and b["drop"] <= 0.02
        print(f"goal (>= 0.03 over naive on the new domain, original within 0.02), {best}, fresh seeds: "
              f"{'met' if met else 'not met'} (gain {b['gain']}, original drop {b['drop']:+.4f})")
        result.update({f"drift_reproduced_{s}": str(drift).lower(), f"naive_eval_train_gap_{s}": f"{gap.mean:.4f}",
                       f"naive_eval_train_gap_ci_low_{s}": f"{gap.low:.4f}",
                       f"naive_eval_train_gap_ci_high_{s}": f"{gap.high:.4f}",
                       f"best_gain_over_naive_{s}": f"{b['gain'].mean:.4f}",
                       f"best_gain_ci_low_{s}": f"{b['gain'].low:.4f}", f"best_gain_ci_high_{s}": f"{b['gain'].high:.4f}",
                       f"original_drop_{s}": f"{b['drop']:.4f}", f"domain_gain_over_naive_{s}": f"{d['gain'].mean:.4f}",
                       f"domain_gain_ci_low_{s}": f"{d['gain'].low:.4f}", f"domain_gain_ci_high_{s}": f"{d['gain'].high:.4f}",
                       f"domain_original_drop_{s}": f"{d['drop']:.4f}"})
    print(f"\ntotal {time.perf_counter() - t0:.0f}s; runs in {work}")
    (work / "result.json").write_text(json.dumps({
        "base": base, "chosen": best, "design": {f"{s}/{p}": v for (s, p), v in design.items()},
        "fresh": {f"{s}/{p}": v for (s, p), v in per_seed.items()}}, indent=2))
    print("RESULT " + " ".join(f"{k}={v}" for k, v in result.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
