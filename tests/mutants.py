"""Mutation testing (`make mutants`): mutmut mutates each module that carries a promise and runs
that module's own fast unit tests against every mutant; a mutant the tests do not catch (a
survivor) is a change to the code that no test notices.

    python tests/mutants.py               # every module below, in this order
    python tests/mutants.py gate ewc      # some of them
    python tests/mutants.py --report gate # the last run's results again, without running
    MUTANT_JOBS=1 python tests/mutants.py gate

Each module runs in its own scratch copy of the tree, build/mutants/NAME/ (mutmut's `mutants/`
folder and its log are there): the working tree is never mutated, so tests that run alongside see
the real code. Printed per module: the changed line of each survivor (`cd build/mutants/NAME &&
mutmut show MUTANT` shows one whole), then one table: mutants, equivalents, killed, survived and the
score, killed / (mutants - equivalents), with the total and the minimum over the modules. The same
figures go to build/mutants/summary.json (every module's last run, not only those run this time).

An equivalent mutant is one no behaviour can tell from the original; EQUIVALENT below lists each,
with its changed line (an entry whose line no longer matches, because the source moved, counts as a
survivor again until it is re-checked) and why. It is left out of the denominator here and only here.
Not a test file (pytest collects test_*.py only).
"""

from __future__ import annotations

import ast
import difflib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MUTMUT = Path(sys.executable).with_name("mutmut")

# name: (the files mutated, globbed from the root; the unit test files that guard them)
MODULES: dict[str, tuple[str, list[str]]] = {
    "gate": ("src/ecotrain/continual/gate.py", ["tests/unit/test_gate.py", "tests/unit/test_gate_cap.py",
                                                 "tests/unit/test_mutants_gate.py"]),
    "ewc": ("src/ecotrain/methods/ewc.py", ["tests/unit/test_ewc.py"]),
    "replay": ("src/ecotrain/methods/replay.py", ["tests/unit/test_replay.py", "tests/unit/test_replay_logits.py"]),
    "objective": ("src/ecotrain/core/objective.py", ["tests/unit/test_objective.py", "tests/unit/test_loop.py",
                                                "tests/unit/test_mutants_objective.py"]),
    "task": ("src/ecotrain/core/task.py", ["tests/unit/test_tasks.py", "tests/unit/test_task_parts.py",
                                      "tests/unit/test_mutants_task.py"]),
    "batchnorm": ("src/ecotrain/methods/batchnorm.py", ["tests/unit/test_batchnorm.py",
                                                        "tests/unit/test_batchnorm_report.py",
                                                        "tests/unit/test_bn_domain.py",
                                                        "tests/unit/test_mutants_batchnorm.py"]),
    "checkpoint": ("src/ecotrain/checkpoint/*.py", ["tests/unit/test_checkpoint.py",
                                                    "tests/unit/test_checkpoint_verify.py",
                                                    "tests/unit/test_checkpoint_format.py",
                                                    "tests/unit/test_checkpoint_manager.py",
                                                    "tests/unit/test_checkpoint_state.py",
                                                    "tests/unit/test_mutants_checkpoint.py"]),
    "compare": ("src/ecotrain/accounting/compare.py", ["tests/unit/test_accounting_compare.py",
                                                       "tests/unit/test_accounting_compare_parts.py"]),
}
# tests that read a module's source text: mutmut's copy holds every mutant's text side by side
DESELECT = {"checkpoint": ["tests/unit/test_checkpoint.py::test_no_torch_load_without_weights_only"]}
# module: {mutant: (its changed line, as printed for a survivor; why no behaviour tells it apart)}
EQUIVALENT: dict[str, dict[str, tuple[str, str]]] = {
    "ewc": {
        'ecotrain.methods.ewc.x_diagonal_fisher__mutmut_62': ('probs = model(xb).float().softmax(+1)',
            "the model's outputs are [n, classes] by construction (cross_entropy on one label per example, probs[:, c]): dim 1 is dim -1"),
        'ecotrain.methods.ewc.x_diagonal_fisher__mutmut_65': ('for c in range(probs.shape[+1]):  # E_c~p [grad^2], exactly, class by class',
            "the model's outputs are [n, classes] by construction (cross_entropy on one label per example, probs[:, c]): dim 1 is dim -1"),
    },
    "gate": {
        'ecotrain.continual.gate.x_accuracy__mutmut_2': ('return float((probs.argmax(-1) == y).float().mean()) if (len(y)) or True else float("nan")',
            'the mean of an empty comparison is already nan: the guard only spares the work'),
        'ecotrain.continual.gate.x_accuracy__mutmut_5': ('return float((probs.argmax(+1) == y).float().mean()) if len(y) else float("nan")',
            'probs is [n, classes] by construction: dim 1 is dim -1'),
        'ecotrain.continual.gate.x_accuracy__mutmut_10': ('return float((probs.argmax(-1) == y).float().mean()) if len(y) else float("NAN")',
            "float('NAN') is float('nan')"),
        'ecotrain.continual.gate.x_slice_metrics__mutmut_20': ('hits.append((p.argmax(+1) == s.y).float())',
            "the model's outputs p are [n, classes]: dim 1 is dim -1"),
        'ecotrain.continual.gate.x_lineage_metrics__mutmut_16': ('bwt = mean_or_none(now[t] - learnt_at[t] for t in old) if (old) or True else None',
            'mean_or_none of nothing is None already: the guard is redundant'),
        'ecotrain.continual.gate.x_lineage_metrics__mutmut_24': ('return {"forgetting": forgetting, "average_forgetting": mean_or_none(forgetting.values()) if (forgetting) or True else None,',
            'mean_or_none of nothing is None already: the guard is redundant'),
    },
    "task": {
        'ecotrain.core.task.xǁTaskǁloss__mutmut_1': ('def NAME(self, outputs, batch, reduction: str = "XXmeanXX") -> torch.Tensor: ...',
            "a Protocol's declaration: its default is never run, implementations carry their own"),
        'ecotrain.core.task.xǁTaskǁloss__mutmut_2': ('def NAME(self, outputs, batch, reduction: str = "MEAN") -> torch.Tensor: ...',
            "a Protocol's declaration: its default is never run, implementations carry their own"),
        'ecotrain.core.task.x__signature__mutmut_48': ('params = [inspect.Parameter("XXargsXX", inspect.Parameter.VAR_POSITIONAL),',
            "the stand-in *args's name is never read (names leaves VAR_POSITIONAL out)"),
        'ecotrain.core.task.x__signature__mutmut_49': ('params = [inspect.Parameter("ARGS", inspect.Parameter.VAR_POSITIONAL),',
            "the stand-in *args's name is never read (names leaves VAR_POSITIONAL out)"),
        'ecotrain.core.task.x__signature__mutmut_54': ('inspect.Parameter("XXkwargsXX", inspect.Parameter.VAR_KEYWORD)]',
            'the stand-in **kwargs makes var_kw true, so names is never consulted'),
        'ecotrain.core.task.x__signature__mutmut_55': ('inspect.Parameter("KWARGS", inspect.Parameter.VAR_KEYWORD)]',
            'the stand-in **kwargs makes var_kw true, so names is never consulted'),
        'ecotrain.core.task.xǁClassificationTaskǁloss__mutmut_15': ('out = out if (type(out) is torch.Tensor) and False else logits_of(out)',
            'logits_of(t) returns a tensor t itself: the type test is a shortcut'),
        'ecotrain.core.task.xǁClassificationTaskǁloss__mutmut_17': ('out = out if type(None) is torch.Tensor else logits_of(out)',
            'logits_of(t) returns a tensor t itself: the type test is a shortcut'),
        'ecotrain.core.task.xǁClassificationTaskǁmetrics__mutmut_4': ('out = {"accuracy": M.Accuracy(ignore=None)}',
            'Accuracy reads ignore as `not self.ignore`: None and False are alike'),
        'ecotrain.core.task.xǁSequenceTaskǁloss__mutmut_26': ('return F.cross_entropy(out.flatten(0, 1), y.reshape(-1), reduction=reduction)',
            "cross_entropy's default ignore_index is -100, which is IGNORE"),
        'ecotrain.core.task.x__nats__mutmut_9': ('nats = F.cross_entropy(out.flatten(0, 1), y.reshape(-1), reduction="sum")',
            "cross_entropy's default ignore_index is -100, which is metrics.IGNORE"),
        'ecotrain.core.task.x_normalized_loss__mutmut_15': ('return loss.nan_to_num(None) * 0.0',
            'the replaced value is multiplied by 0.0: any finite fill gives 0'),
        'ecotrain.core.task.x_normalized_loss__mutmut_16': ('return loss.nan_to_num(1.0) * 0.0',
            'the replaced value is multiplied by 0.0: any finite fill gives 0'),
        'ecotrain.core.task.x_normalized_loss__mutmut_18': ('return loss if (n == total_units) and False else loss * (n / total_units)',
            'loss * (n / n) is loss * 1.0, bit for bit the loss'),
    },
    "batchnorm": {
        'ecotrain.methods.batchnorm.xǁBatchNormPolicyǁ__init____mutmut_1': ('def NAME(self, cfg, strategy: str = "XXnoneXX"):',
            "the default strategy is only compared with 'fsdp'"),
        'ecotrain.methods.batchnorm.xǁBatchNormPolicyǁ__init____mutmut_2': ('def NAME(self, cfg, strategy: str = "NONE"):',
            "the default strategy is only compared with 'fsdp'"),
        'ecotrain.methods.batchnorm.xǁBatchNormPolicyǁ__init____mutmut_27': ('self.report: dict = None',
            'report is only read as `self.report or {...}`: None and {} are alike'),
        'ecotrain.methods.batchnorm.xǁBatchNormPolicyǁ__init____mutmut_30': ('self.carried_start: Optional[Stats] = ""  # domains_from\'s pre-trained statistics',
            "carried_start is only read as `self.carried_start or self.start`: '' and None are alike"),
        'ecotrain.methods.batchnorm.xǁBatchNormPolicyǁ_mode_accuracies__mutmut_5': ('kept = [{k: v.clone() for k, v in m.named_buffers(recurse=None)} for m in bns]',
            'a BatchNorm layer has no submodules: recurse changes nothing (None is falsy)'),
        'ecotrain.methods.batchnorm.xǁBatchNormPolicyǁ_mode_accuracies__mutmut_6': ('kept = [{k: v.clone() for k, v in m.named_buffers(recurse=True)} for m in bns]',
            'a BatchNorm layer has no submodules: recurse changes nothing'),
        'ecotrain.methods.batchnorm.xǁBatchNormPolicyǁ_mode_accuracies__mutmut_16': ('eval_acc = accuracy(model, val, 257, device)',
            "in eval mode BN uses its running statistics: the pass's batch size changes no prediction"),
        'ecotrain.methods.batchnorm.xǁBatchNormPolicyǁ_mode_accuracies__mutmut_48': ('if eval_acc is None and train_acc is None:',
            'both passes run the same model on the same split: accuracy is None for both or neither'),
        'ecotrain.methods.batchnorm.x_read_report__mutmut_22': ('summary = json.loads(path.read_text(encoding="UTF-8"))',
            "'UTF-8' and 'utf-8' name the same codec"),
        'ecotrain.methods.batchnorm.x_verdict__mutmut_15': ('if r.get("warned") and gap >= 0:',
            'warned means |gap| > warn_gap >= 0 (config: ge=0), so a warned gap is never 0'),
        'ecotrain.methods.batchnorm.x_to_groupnorm__mutmut_56': ('setattr(model.get_submodule(parent_name) if (parent_name) or True else model, child, gn)',
            "model.get_submodule('') is the model itself"),
    },
    "checkpoint": {
        'ecotrain.checkpoint.format.x_tensor_refs__mutmut_7': ('return set().union(*map(tensor_refs, skel.values())) if (skel) or True else set()',
            'set().union() of no sets is set(): the guard only spares the call'),
        'ecotrain.checkpoint.format.x_tensor_refs__mutmut_13': ('return set().union(*map(tensor_refs, skel)) if (skel) or True else set()',
            'set().union() of no sets is set(): the guard only spares the call'),
        'ecotrain.checkpoint.snapshot.x_set_rng_state__mutmut_21': ('np.random.set_state(("MT19937", n["keys"].numpy().astype(None), n["pos"], n["has_gauss"], n["gauss"]))',
            "astype(None) is float64, exact for every uint32 key; numpy's set_state casts it back"),
        'ecotrain.checkpoint.sharded.x_load_model_optim_state__mutmut_3': ('set_state_dict(model, optimizer, model_state_dict=None, optim_state_dict=optim_sd)',
            "dcp.load already filled the model's own tensors in place (flatten keep=True); set_state_dict's model copy is a second, identical load"),
        'ecotrain.checkpoint.sharded.x_load_into__mutmut_43': ('load_model_optim_state(model, optimizer, None, big["optimizer"])',
            "dcp.load already filled the model's own tensors in place (flatten keep=True); set_state_dict's model copy is a second, identical load"),
        'ecotrain.checkpoint.sharded.x_load_into__mutmut_23': ('flatten(template, tensors, keep=None)',
            'without keep, dcp.load fills copies and set_state_dict then loads them: the same weights and optimizer state'),
        'ecotrain.checkpoint.sharded.x_load_into__mutmut_26': ('flatten(template, tensors, )',
            'without keep, dcp.load fills copies and set_state_dict then loads them: the same weights and optimizer state'),
        'ecotrain.checkpoint.sharded.x_load_into__mutmut_27': ('flatten(template, tensors, keep=False)',
            'without keep, dcp.load fills copies and set_state_dict then loads them: the same weights and optimizer state'),
    },
}
COPIED = ("src", "tests", "recipes", "pyproject.toml")  # what the unit tests read (recipes: a CLI test)


def scratch_tree(name: str, mutate: str, tests: list[str], deselect: list[str]) -> Path:
    """build/mutants/NAME: a fresh copy of the tree, with mutmut's config for this module alone."""
    work = ROOT / "build" / "mutants" / name
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info", ".pytest_cache")
    for item in COPIED:
        src = ROOT / item
        if src.is_dir():
            shutil.copytree(src, work / item, ignore=skip)
        else:
            shutil.copy2(src, work / item)
    pyproject = (work / "pyproject.toml").read_text()
    if "[tool.mutmut]" in pyproject:  # mutmut would read it instead of the setup.cfg below
        raise SystemExit("pyproject.toml has a [tool.mutmut] table; tests/mutants.py configures mutmut per module")
    lines = "\n  ".join
    (work / "setup.cfg").write_text(
        "[mutmut]\n"
        "source_paths = src\n"
        f"only_mutate = {mutate}\n"
        f"pytest_add_cli_args_test_selection =\n  {lines(tests)}\n"
        "pytest_add_cli_args =\n  -p\n  no:xdist\n  -p\n  no:cacheprovider\n"
        + "".join(f"  --deselect\n  {t}\n" for t in deselect) +
        "also_copy = recipes\n"
        "use_git_change_detection = false\n")
    return work


def run_module(name: str, jobs: int) -> dict:
    mutate, tests = MODULES[name]
    work = scratch_tree(name, mutate, tests, DESELECT.get(name, []))
    # (the folder exists before mutmut starts: a PYTHONPATH entry missing at start-up is cached as absent)
    (work / "mutants" / "src").mkdir(parents=True)
    with open(work / "run.log", "w") as log:
        r = subprocess.run([str(MUTMUT), "run", "--max-children", str(jobs)], cwd=work, env=_env(work),
                           stdout=log, stderr=subprocess.STDOUT)
    if r.returncode != 0:
        return {"name": name, "error": f"mutmut run exited {r.returncode}; see {work / 'run.log'}"}
    return last_run(name)


def _env(work: Path) -> dict:
    # tests that start `python -m ecotrain` must import the mutated copy too, not the editable install
    return {**os.environ, "PYTHONPATH": str(work / "mutants" / "src"), "OMP_NUM_THREADS": "1"}


def last_run(name: str) -> dict:
    """The figures and survivors of the last run of module `name` (build/mutants/NAME)."""
    work = ROOT / "build" / "mutants" / name
    if not (work / "mutants").is_dir():
        return {"name": name, "error": f"no run in {work}"}
    env = _env(work)
    subprocess.run([str(MUTMUT), "export-cicd-stats"], cwd=work, env=env, capture_output=True, check=True)
    stats = json.loads((work / "mutants" / "mutmut-cicd-stats.json").read_text())
    listed = subprocess.run([str(MUTMUT), "results"], cwd=work, env=env, capture_output=True, text=True).stdout
    functions = mutant_functions(work / "mutants" / "src")
    survivors = []
    for m in re.finditer(r"^\s*(\S+): (survived|no tests|timeout|suspicious)$", listed, re.M):
        survivors.append((m[1], m[2], changed_line(functions, m[1].rsplit(".", 1)[-1])))
    return {"name": name, **stats, "survivors": survivors}


def mutant_functions(src: Path) -> dict[str, list[str]]:
    """Every function mutmut wrote (each mutant and each original, `NAME__mutmut_N`), by name: its
    source lines. (One `mutmut show` per survivor starts a process each: minutes for a big module.)"""
    out = {}
    for path in src.rglob("*.py"):
        text = path.read_text()
        if "__mutmut_orig" not in text:
            continue
        lines = text.splitlines()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and "__mutmut_" in node.name:
                own = lines[node.lineno - 1:node.end_lineno]  # the def line too (a changed default), its name hidden
                out[node.name] = [own[0].replace(node.name, "NAME", 1), *own[1:]]
    return out


def changed_line(functions: dict[str, list[str]], mutant: str) -> str:
    """The mutant's lines that differ from the original's."""
    orig = functions.get(mutant.rsplit("__mutmut_", 1)[0] + "__mutmut_orig")
    mine = functions.get(mutant)
    if orig is None or mine is None:
        return "?"
    diff = difflib.unified_diff(orig, mine, lineterm="", n=0)
    return " | ".join(ln[1:].strip() for ln in diff if ln.startswith("+") and not ln.startswith("+++"))


def main(argv: list[str]) -> int:
    report_only = "--report" in argv  # print the last run's results again, without running
    names = [a for a in argv if a != "--report"] or list(MODULES)
    unknown = [n for n in names if n not in MODULES]
    if unknown:
        print(f"unknown module {unknown[0]!r}; one of: {', '.join(MODULES)}", file=sys.stderr)
        return 2
    if not MUTMUT.exists():
        print(f"{MUTMUT} not found; `make mutants` installs mutmut", file=sys.stderr)
        return 2
    jobs = int(os.environ.get("MUTANT_JOBS", "2"))
    results = []
    for name in names:
        print(f"== {name}: {MODULES[name][0]} against {' '.join(MODULES[name][1])}", flush=True)
        res = last_run(name) if report_only else run_module(name, jobs)
        results.append(res)
        if "error" in res:
            print("   " + res["error"], flush=True)
            continue
        for mutant, status, line in res["survivors"]:
            if _is_equivalent(name, mutant, line):
                status = "equivalent"
            print(f"   {status}: {mutant}: {line}", flush=True)
    rows = {r["name"]: score_row(r) for r in results if "error" not in r}
    for name, line in stale_equivalents(results):
        print(f"   stale equivalent {name} ({line!r}): re-check it in tests/mutants.py", flush=True)
    print_table(results, rows)
    write_summary(names, rows)
    return 1 if any("error" in r for r in results) else 0


def score_row(r: dict) -> dict:
    """One module's figures: an equivalent counts only while it is a survivor with its listed line."""
    eq = sum(1 for mutant, _, line in r["survivors"] if _is_equivalent(r["name"], mutant, line))
    live = r["total"] - eq
    return {"mutants": r["total"], "equivalents": eq, "killed": r["killed"], "survived": live - r["killed"],
            "score": round(r["killed"] / live, 4) if live else None}


def _is_equivalent(module: str, mutant: str, line: str) -> bool:
    listed = EQUIVALENT.get(module, {}).get(mutant)
    return listed is not None and listed[0] == line


def stale_equivalents(results: list[dict]) -> list[tuple[str, str]]:
    """Listed equivalents whose mutant survived with another changed line (the source moved)."""
    out = []
    for r in results:
        listed = EQUIVALENT.get(r["name"], {})
        out += [(m, line) for m, _, line in r.get("survivors", []) if m in listed and listed[m][0] != line]
        if "error" not in r:  # killed (or gone): a test tells it apart after all, so it is no equivalent
            left = {m for m, _, _ in r["survivors"]}
            out += [(m, "killed or gone") for m in listed if m not in left]
    return out


def totals(rows: dict) -> dict:
    t = {k: sum(r[k] for r in rows.values()) for k in ("mutants", "equivalents", "killed")}
    live = t["mutants"] - t["equivalents"]
    return {**t, "survived": live - t["killed"], "score": round(t["killed"] / live, 4) if live else None}


def print_table(results: list[dict], rows: dict) -> None:
    print(f"\n{'module':<12}{'mutants':>8}{'equiv':>7}{'killed':>8}{'survived':>9}{'score':>8}   equivalents")
    for r in results:
        if "error" in r:
            print(f"{r['name']:<12}  {r['error']}")
            continue
        x = rows[r["name"]]
        eq = ", ".join(m.rsplit(".", 1)[-1] for m, _, line in r["survivors"] if _is_equivalent(r["name"], m, line))
        print(f"{r['name']:<12}{x['mutants']:>8}{x['equivalents']:>7}{x['killed']:>8}{x['survived']:>9}"
              f"{_pct(x['score']):>8}   {eq}")
    if rows:
        t = totals(rows)
        print(f"{'total':<12}{t['mutants']:>8}{t['equivalents']:>7}{t['killed']:>8}{t['survived']:>9}{_pct(t['score']):>8}")
        low = min(rows, key=lambda n: rows[n]["score"] if rows[n]["score"] is not None else 1.0)
        print(f"{'min':<12}{'':>40}{_pct(rows[low]['score']):>8}   ({low})")


def _pct(x) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def write_summary(names: list[str], rows: dict) -> None:
    """build/mutants/summary.json: every module's last figures (this call's, else its last run's);
    a module never run is listed under "not_run" and leaves "min" out of reach (null)."""
    all_rows, not_run = dict(rows), []
    for name in MODULES:
        if name in all_rows:
            continue
        r = last_run(name) if name not in names else {"error": "failed"}
        if "error" in r:
            not_run.append(name)
        else:
            all_rows[name] = score_row(r)
    scores = [r["score"] for r in all_rows.values() if r["score"] is not None]
    out = {name: all_rows[name] for name in MODULES if name in all_rows}
    out["total"] = totals(all_rows)
    out["min"] = min(scores) if scores and not not_run else None
    out["not_run"] = not_run
    path = ROOT / "build" / "mutants" / "summary.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"(written: {path.relative_to(ROOT)})")

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
