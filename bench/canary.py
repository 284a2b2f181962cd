"""The canary before promotion, measured: does `ecotrain canary` block every bad candidate and promote every
good one, judged on requests it never read?

    .venv/bin/python bench/canary.py [--seeds 201-210] [--out runs/bench-canary] [--quick]

Per seed: Split MNIST-1D's joint data (all ten classes), a base model (a quarter of the data) registered as v0001, then candidates
made with `ecotrain update current ... --hold` on it, each served beside current by `ecotrain canary` on the
recorded requests (the even half of the joint test split, with their labels) under the rule
`--max-drop 0.01 --max-latency-ratio 1.5`, then rolled back so the next candidate is made on the same base:
- good kinds: the base saw a quarter of the training data; an update on all of it (`more`), and the same
  with replay of the base's buffer (`replay`);
- bad kinds: naive fine-tuning on one task's two classes (`forgetful`), and an update on all of it from an
  annotator who swaps two pairs of classes, on the new data's test split too (`swapped`); the lax gate
  (--tolerance 1) lets both through, as a gate that reads the new data's own labels would.
Whether a candidate *is* good or bad is read on the odd half of the test split, which no decision reads:
good when its accuracy there is no lower than current's, bad when it is lower by at least twice
--max-drop; between the two it counts in neither (`ambiguous`).

Ends with `RESULT canary_bad_blocked=K/N canary_good_promoted=K/N canary_ambiguous=M mode=shadow seeds=...
held=H` (blocked: rejected or held; promoted: promoted).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np

from ecotrain import Config, fit
from ecotrain.cli import main
from ecotrain.continual.registry import Registry
from ecotrain.continual.scenario import write_tasks
from ecotrain.seeds.sweep import parse_seeds

MAX_DROP, MAX_LATENCY = 0.01, 1.5
STEPS = ["loop.max_steps=120", "optim.lr=0.002"]
KINDS = {  # name: (good?, data file key, extra update args)
    "more": (True, "all", ["--tolerance", "1.0", "methods=[]", *STEPS]),
    "replay": (True, "all", ["--tolerance", "1.0", "methods=[{name: replay, size: 200, ratio: 0.3}]", *STEPS]),
    "forgetful": (False, "task_1", ["--tolerance", "1.0", "methods=[]", "loop.max_steps=80", "optim.lr=0.005"]),
    "swapped": (False, "swapped", ["--tolerance", "1.0", "methods=[]", *STEPS]),
}


def cli(*args) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in args])
    return code, out.getvalue() + err.getvalue()


def accuracy_on(reg: Registry, name: str, x, y) -> float:
    from ecotrain.continual.gate import accuracy, predict_proba
    from ecotrain.continual.versions import load_version_model
    import torch

    return accuracy(predict_proba(load_version_model(reg, name), torch.as_tensor(x)), torch.as_tensor(y))


def one_seed(seed: int, root: Path, quick: bool) -> list[dict]:
    root.mkdir(parents=True, exist_ok=True)
    tasks = write_tasks(root / "tasks", num_samples=2500 if quick else 6250, tasks=5, seed=seed)
    files = {"all": root / "tasks" / "all.npz", "task_1": tasks[1]}
    z = dict(np.load(files["all"]))
    rng = np.random.default_rng(seed)
    swap = np.arange(10)
    swap[[3, 5, 2, 7]] = [5, 3, 7, 2]  # an annotator who confuses two pairs of classes, on train and test alike
    np.savez(root / "swapped.npz", **{**z, "y": swap[z["y"]], "y_test": swap[z["y_test"]]})
    files["swapped"] = root / "swapped.npz"
    keep = rng.permutation(len(z["y"]))[: len(z["y"]) // 4]  # the base saw a quarter of today's data
    np.savez(root / "base.npz", **{**z, "x": z["x"][keep], "y": z["y"][keep]})
    n = len(z["y_test"])
    np.savez(root / "requests.npz", x=z["x_test"][0:n:2], y=z["y_test"][0:n:2])  # what the canary reads
    judge_x, judge_y = z["x_test"][1:n:2], z["y_test"][1:n:2]  # what says good or bad; no decision reads it

    cfg = Config.model_validate({
        "name": "base", "seed": seed, "threads": 1,
        "data": {"name": "npz", "path": str(root / "base.npz"), "num_classes": 10, "batch_size": 32},
        "model": {"name": "mlp", "kwargs": {"hidden": [128]}},
        "loop": {"max_steps": 150 if quick else 600, "max_epochs": None, "log_every": 50},
        "methods": [{"name": "replay", "size": 200}], "logging": {"progress": "off"}, "ledger": {"enabled": False}})
    fit(cfg, run_dir=root / "base", quiet=True)
    reg_dir = root / "registry"
    reg = Registry(reg_dir)
    code, said = cli("versions", "add", root / "base", "--registry", reg_dir)
    assert code == 0, said
    base_acc = accuracy_on(reg, "v0001", judge_x, judge_y)
    rows = []
    for kind, (meant_good, data, extra) in KINDS.items():
        code, said = cli("update", "current", files[data], "--registry", reg_dir, "--hold", f"seed={seed}", *extra)
        name = next((m.group(1) for m in re.finditer(r"^(v\d+): ", said, re.M)), "?")
        if code != 0 or reg.index()["versions"].get(name, {}).get("status") != "candidate":
            rows.append({"seed": seed, "kind": kind, "meant_good": meant_good, "decision": "gate", "note": said[-300:]})
            continue
        drop = base_acc - accuracy_on(reg, name, judge_x, judge_y)
        truth = "good" if drop <= 0 else ("bad" if drop >= 2 * MAX_DROP else "ambiguous")
        code, said = cli("canary", name, root / "requests.npz", "--registry", reg_dir, "--max-drop", MAX_DROP,
                         "--max-latency-ratio", MAX_LATENCY, "--seed", seed)
        decision = reg.index()["versions"][name].get("canary", {}).get("decision", "error")
        rows.append({"seed": seed, "kind": kind, "meant_good": meant_good, "truth": truth, "judge_drop": round(drop, 4),
                     "decision": decision, "line": said.strip().splitlines()[0] if said.strip() else ""})
        print(f"seed {seed} {kind:9s} judged {truth:9s} (drop {drop:+.4f} on unread requests): {decision}; "
              f"{rows[-1]['line']}", flush=True)
        if decision == "promote":
            code, said = cli("rollback", "--registry", reg_dir)
            assert code == 0, said
    return rows


def main_() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="201-210", help="seeds no design step used (default 201-210; 101 designed the kinds)")
    ap.add_argument("--out", default="runs/bench-canary")
    ap.add_argument("--quick", action="store_true", help="one seed, smaller data: the plumbing")
    args = ap.parse_args()
    seeds = parse_seeds("101" if args.quick else args.seeds)
    out = Path(tempfile.mkdtemp()) / "canary" if args.quick else Path(args.out)  # quick: never over the figures
    shutil.rmtree(out, ignore_errors=True)
    rows = [r for s in seeds for r in one_seed(s, out / f"s{s}", args.quick)]
    bad = [r for r in rows if r.get("truth") == "bad"]
    good = [r for r in rows if r.get("truth") == "good"]
    blocked = sum(1 for r in bad if r["decision"] in ("reject", "hold"))
    promoted = sum(1 for r in good if r["decision"] == "promote")
    held = sum(1 for r in rows if r.get("decision") == "hold")
    gated = sum(1 for r in rows if r.get("decision") == "gate")
    ambiguous = sum(1 for r in rows if r.get("truth") == "ambiguous")
    print(f"RESULT canary_bad_blocked={blocked}/{len(bad)} canary_good_promoted={promoted}/{len(good)} "
          f"canary_ambiguous={ambiguous} held={held} not_past_gate={gated} mode=shadow "
          f"seeds={','.join(str(s) for s in seeds)} max_drop={MAX_DROP} max_latency_ratio={MAX_LATENCY}")


if __name__ == "__main__":
    main_()
