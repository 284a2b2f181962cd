"""Mutation testing (`make mutants`): mutmut mutates each module that carries a promise and runs
that module's own fast unit tests against every mutant; a mutant the tests do not catch (a
survivor) is a change to the code that no test notices.

    python tests/mutants.py               # every module below, in this order
    python tests/mutants.py gate ewc      # some of them
    python tests/mutants.py --report gate # the last run's results again, without running
    MUTANT_JOBS=1 python tests/mutants.py gate

Each module runs in its own scratch copy of the tree, build/mutants/NAME/ (mutmut's `mutants/`
folder and its log are there): the working tree is never mutated, so tests that run alongside see
the real code. Printed per module: mutants, killed, survived, the score (killed / mutants), and
the changed line of each survivor; `cd build/mutants/NAME && mutmut show MUTANT` shows one whole.
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
    "gate": ("src/ecotrain/continual/gate.py", ["tests/unit/test_gate.py", "tests/unit/test_gate_cap.py"]),
    "ewc": ("src/ecotrain/methods/ewc.py", ["tests/unit/test_ewc.py"]),
    "replay": ("src/ecotrain/methods/replay.py", ["tests/unit/test_replay.py", "tests/unit/test_replay_logits.py"]),
    "objective": ("src/ecotrain/objective.py", ["tests/unit/test_objective.py", "tests/unit/test_loop.py"]),
    "task": ("src/ecotrain/task.py", ["tests/unit/test_tasks.py", "tests/unit/test_task_parts.py"]),
    "batchnorm": ("src/ecotrain/methods/batchnorm.py", ["tests/unit/test_batchnorm.py",
                                                        "tests/unit/test_batchnorm_report.py",
                                                        "tests/unit/test_bn_domain.py"]),
    "checkpoint": ("src/ecotrain/checkpoint/*.py", ["tests/unit/test_checkpoint.py",
                                                    "tests/unit/test_checkpoint_verify.py",
                                                    "tests/unit/test_checkpoint_format.py",
                                                    "tests/unit/test_checkpoint_manager.py",
                                                    "tests/unit/test_checkpoint_state.py"]),
    "compare": ("src/ecotrain/accounting/compare.py", ["tests/unit/test_accounting_compare.py",
                                                       "tests/unit/test_accounting_compare_parts.py"]),
}
# tests that read a module's source text: mutmut's copy holds every mutant's text side by side
DESELECT = {"checkpoint": ["tests/unit/test_checkpoint.py::test_no_torch_load_without_weights_only"]}
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
                out[node.name] = lines[node.lineno:node.end_lineno]  # the body, without the def line
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
            print(f"   {status}: {mutant}: {line}", flush=True)
    print(f"\n{'module':<12}{'mutants':>8}{'killed':>8}{'survived':>9}{'no tests':>9}{'timeout':>8}{'score':>8}")
    for r in results:
        if "error" in r:
            print(f"{r['name']:<12}  {r['error']}")
            continue
        score = (r["killed"] / r["total"]) if r["total"] else float("nan")
        print(f"{r['name']:<12}{r['total']:>8}{r['killed']:>8}{r['survived']:>9}{r['no_tests']:>9}"
              f"{r['timeout']:>8}{score:>8.1%}")
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
