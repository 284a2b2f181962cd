"""The hostile corpus: inputs and faults a new user (or a bad day) brings, and what ecotrain must answer.

Each `Case` is one run of the real CLI in a fresh folder (`{tmp}` in the arguments):
- `setup(tmp)` writes the files it needs (`tmp/tiny.yaml`, a small recipe, is always there);
- `args` are the command line after `ecotrain`;
- `code` is the exact exit code (docs/cli.md "Exit codes");
- `words` must all be in the one `ecotrain: error: ...` line (for code 0: anywhere on stderr);
- every file present after `setup` must be byte-identical afterwards, except those matching `may_change`
  (glob patterns relative to tmp), so nothing the user had is lost or rewritten;
- `absent`: globs (relative to tmp) that must match nothing afterwards, e.g. a run folder a refused
  start must not leave behind;
- `xfail`: a known gap not mended yet, and where (strict: a case that starts passing must drop it).

Adding a case is a few lines: `Case("id", ["fit", "{tmp}/tiny.yaml", "x=1"], 2, ["x"])`.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np

TINY = """\
# ecotrain fit tiny.yaml: digits, a small MLP, 4 steps; the hostile cases' base recipe
name: tiny
data: {name: digits, batch_size: 32, val_split: 0.1, test_split: 0.2}
model: {name: mlp, kwargs: {hidden: [16]}}
loop: {max_steps: 4, max_epochs: null, log_every: 2, eval_every: 2}
checkpoint: {every_n_steps: 2, keep_last: 2}
logging: {progress: "off"}
ledger: {energy: "off"}
"""
RANDOM_BYTES = bytes((i * 167 + 13) % 256 for i in range(512))  # fixed, not UTF-8, not any format


@dataclass
class Case:
    id: str
    args: Sequence[str]
    code: int
    words: Sequence[str] = ()
    setup: Optional[Callable[[Path], None]] = None
    may_change: Sequence[str] = ()
    absent: Sequence[str] = ()
    env: dict = field(default_factory=dict)
    cwd: str = "."  # relative to tmp
    needs_non_root: bool = False  # permission cases: root reads every file
    isolated: bool = False  # run in a fresh `python -m ecotrain` process instead of calling cli.main here
    xfail: str = ""  # a known gap, with where it is to be mended (strict: passing unexpectedly fails)


# ---- setup helpers: each returns nothing and writes under tmp ----

def write(name: str, content: str | bytes, mode: Optional[int] = None) -> Callable[[Path], None]:
    def setup(tmp: Path) -> None:
        p = tmp / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(content if isinstance(content, bytes) else content.encode())
        if mode is not None:
            p.chmod(mode)
    return setup


def edit_json(name: str, change: Callable[[object], None]) -> Callable[[Path], None]:
    """Rewrite tmp/name's JSON through `change(obj)` (an edit in place)."""
    def setup(tmp: Path) -> None:
        p = tmp / name
        obj = json.loads(p.read_text())
        change(obj)
        p.write_text(json.dumps(obj))
    return setup


def npz(name: str, **arrays) -> Callable[[Path], None]:
    def setup(tmp: Path) -> None:
        np.savez(tmp / name, **{k: v() if callable(v) else v for k, v in arrays.items()})
    return setup


def both(*setups: Callable[[Path], None]) -> Callable[[Path], None]:
    def setup(tmp: Path) -> None:
        for s in setups:
            s(tmp)
    return setup


_TRAINED: dict[tuple, Path] = {}  # one real training per distinct setup in a session; each case gets a copy


def trained_run(name: str = "run", *overrides: str, inputs: Optional[Callable[[Path], None]] = None
                ) -> Callable[[Path], None]:
    """A finished tiny run at tmp/name: checkpoints at steps 2 and 4, model.safetensors, summary.json.
    Trained once per distinct `overrides` (by the real CLI, in a subprocess: no torch or logging state
    in the test process) and copied into each case's folder, which keeps the corpus fast.
    `inputs(home)` writes files the training reads (relative paths are from its folder, as from tmp);
    it is part of the key, so pass one shared setup object, not a new one per case."""
    def setup(tmp: Path) -> None:
        import atexit
        import tempfile

        from tests.conftest import run_cli

        key = (overrides, inputs)
        if key not in _TRAINED:
            home = Path(tempfile.mkdtemp(prefix="ecotrain-hostile-"))
            atexit.register(shutil.rmtree, home, True)
            (home / "tiny.yaml").write_text(TINY)
            if inputs is not None:
                inputs(home)
            r = run_cli("fit", home / "tiny.yaml", *overrides, "--run-dir", home / "run", "--quiet", cwd=home)
            assert r.returncode == 0, r.stderr
            _TRAINED[key] = home / "run"
        shutil.copytree(_TRAINED[key], tmp / name)
    return setup


def replace_tensors(run: str, step: int, content: Callable[[Path], bytes]) -> Callable[[Path], None]:
    """Replace a checkpoint's tensors.safetensors and update MANIFEST.json to match, so checksums pass."""
    def setup(tmp: Path) -> None:
        from ecotrain.checkpoint.format import _digest

        ckpt = tmp / run / "checkpoints" / f"step-{step:08d}"
        t = ckpt / "tensors.safetensors"
        t.write_bytes(content(tmp))
        manifest = json.loads((ckpt / "MANIFEST.json").read_text())
        manifest["files"]["tensors.safetensors"] = {"xxh3_128": _digest(t), "bytes": t.stat().st_size}
        (ckpt / "MANIFEST.json").write_text(json.dumps(manifest, indent=2))
    return setup


def copy(src: str, dst: str) -> Callable[[Path], None]:
    def setup(tmp: Path) -> None:
        (shutil.copytree if (tmp / src).is_dir() else shutil.copy)(tmp / src, tmp / dst)
    return setup


def _rows(n: int, classes: int = 3, features: int = 4):
    rng = np.random.default_rng(0)
    return rng.normal(size=(n, features)).astype(np.float32), np.arange(n) % classes


X, Y = _rows(60)
FIT = ["fit", "{tmp}/tiny.yaml"]
RUN = ["--run-dir", "{tmp}/run"]
NO_RUN = ("run",)  # a refused start leaves no run folder

DATASETS = """\
import torch


class Base(torch.utils.data.Dataset):
    def __len__(self):
        return 30

    def __getitem__(self, i):
        return torch.full((4,), float(i % 3)), i % 3


class FactoryRaises(Base):
    def __init__(self, **kwargs):
        raise ValueError("factory refuses")


class ItemRaises(Base):
    def __getitem__(self, i):
        if i == 7:
            raise KeyError(i)
        return super().__getitem__(i)


class LenRaises(Base):
    def __len__(self):
        raise RuntimeError("no length")


class NotPairs(Base):
    def __getitem__(self, i):
        return torch.zeros(4)


class CtorRaises:
    def __init__(self, **kwargs):
        raise RuntimeError("needs a licence key")


class MixedShapes(Base):
    def __getitem__(self, i):
        return torch.zeros(4 + (i == 5)), i % 3


class LabelTooBig(Base):
    num_classes = 3

    def __getitem__(self, i):
        return torch.zeros(4), 5 if i == 9 else i % 3


def make_base():
    return Base()
"""
DS = write("userdata.py", DATASETS)
RAISES_ON_IMPORT = write("broken_mod.py", 'raise RuntimeError("this module fails\\nwhen imported")\n')
PYPATH = {"PYTHONPATH": "{tmp}"}


CASES: list[Case] = [
    # ---- recipes ----
    Case("recipe_random_bytes", ["fit", "{tmp}/bytes.yaml"], 2, ["bytes.yaml", "not a text file", "UTF-8"],
         write("bytes.yaml", RANDOM_BYTES), isolated=True),
    Case("recipe_empty", ["fit", "{tmp}/empty.yaml"], 2, ["empty.yaml", "recipe is empty", "data:"],
         write("empty.yaml", "")),
    Case("recipe_only_comments", ["fit", "{tmp}/c.yaml"], 2, ["recipe is empty"], write("c.yaml", "# nothing\n")),
    Case("recipe_is_a_folder", ["fit", "{tmp}/d"], 2, ["is a folder", "recipe file"], write("d/x", "")),
    Case("recipe_not_a_mapping", ["fit", "{tmp}/l.yaml"], 2, ["mapping"], write("l.yaml", "- a\n- b\n")),
    Case("plan_recipe_random_bytes", ["plan", "{tmp}/bytes.yaml"], 2, ["not a text file"],
         write("bytes.yaml", RANDOM_BYTES)),

    # ---- every float finite, names not paths, seeds in range ----
    Case("lr_inf", [*FIT, "optim.lr=.inf", *RUN], 2, ["optim.lr", "finite"], absent=NO_RUN),
    Case("lr_nan", [*FIT, "optim.lr=.nan", *RUN], 2, ["optim.lr", "finite"], absent=NO_RUN),
    Case("lr_minus_inf", [*FIT, "optim.lr=-.inf", *RUN], 2, ["optim.lr", "finite"], absent=NO_RUN),
    Case("betas_nan", [*FIT, "optim.betas=[0.9, .nan]", *RUN], 2, ["optim.betas.1", "finite"], absent=NO_RUN),
    Case("betas_above_one", [*FIT, "optim.betas=[0.9, 1.5]", *RUN], 2, ["optim.betas.1", "less than 1"]),
    Case("budget_inf", [*FIT, "budget.max_wall_seconds=.inf", *RUN], 2, ["budget.max_wall_seconds", "finite"]),
    Case("price_inf", [*FIT, "ledger.prices={cpu: .inf}", *RUN], 2, ["ledger.prices.cpu", "finite"]),
    Case("grad_clip_inf", [*FIT, "loop.grad_clip=.inf", *RUN], 2, ["loop.grad_clip", "finite"]),
    Case("name_escapes_runs", [*FIT, "name=../../escaped"], 2, ["'name'", "not a path", "--run-dir"],
         cwd="work/here", absent=("**/escaped*", "work/here/runs")),
    Case("name_absolute_path", [*FIT, "name=/tmp/elsewhere"], 2, ["'name'", "not a path"], cwd="work"),
    Case("name_hidden", [*FIT, "name=.hidden"], 2, ["'name'", "not a path"], cwd="work", absent=("work/runs",)),
    Case("seed_negative", [*FIT, "seed=-1", *RUN], 2, ["'seed'", "greater than or equal to 0"], absent=NO_RUN),

    # ---- data: the user's files ----
    Case("npz_object_arrays", [*FIT, "data.name=npz", "data.path={tmp}/obj.npz", *RUN], 2,
         ["obj.npz", "dtype=object", "never unpickles"],
         npz("obj.npz", x=np.array([{"a": 1}] * 10, dtype=object), y=np.arange(10)), absent=NO_RUN),
    Case("npz_string_features", [*FIT, "data.name=npz", "data.path={tmp}/s.npz", *RUN], 2,
         ["s.npz", "features must be numbers", "<U1"], npz("s.npz", x=np.array([["a", "b"]] * 30), y=Y[:30])),
    Case("npz_labels_2d", [*FIT, "data.name=npz", "data.path={tmp}/y2.npz", *RUN], 2,
         ["y2.npz", "one class id per sample", "(60, 2)"], npz("y2.npz", x=X, y=np.stack([Y, Y], 1))),
    Case("npz_features_1d", [*FIT, "data.name=npz", "data.path={tmp}/x1.npz", *RUN], 2,
         ["x1.npz", "one row per sample", "x[:, None]"], npz("x1.npz", x=X[:, 0], y=Y)),
    Case("npz_x_test_without_y_test", [*FIT, "data.name=npz", "data.path={tmp}/t.npz", *RUN], 2,
         ["t.npz", "'x_test' but no 'y_test'"], npz("t.npz", x=X, y=Y, x_test=X[:5])),
    Case("npz_random_bytes", [*FIT, "data.name=npz", "data.path={tmp}/r.npz", *RUN], 2,
         ["r.npz", "cannot read as .npz"], write("r.npz", RANDOM_BYTES)),
    Case("npz_truncated", [*FIT, "data.name=npz", "data.path={tmp}/cut.npz", *RUN], 2, ["cut.npz", "cannot read"],
         both(npz("full.npz", x=X, y=Y), lambda t: (t / "cut.npz").write_bytes((t / "full.npz").read_bytes()[:900]))),
    Case("npy_not_npz", [*FIT, "data.name=npz", "data.path={tmp}/a.npy", *RUN], 2, ["a.npy", "not an .npz archive"],
         lambda t: np.save(t / "a.npy", X)),
    Case("npz_negative_label", [*FIT, "data.name=npz", "data.path={tmp}/neg.npz", *RUN], 2,
         ["label -1 at row 0", "class ids 0 or more"], npz("neg.npz", x=X, y=Y - 1)),
    Case("npz_nan_features", [*FIT, "data.name=npz", "data.path={tmp}/nan.npz", *RUN], 2, ["NaN/Inf", "row 3"],
         npz("nan.npz", x=np.where(np.arange(60)[:, None] == 3, np.nan, X), y=Y)),
    Case("csv_bad_encoding", [*FIT, "data.name=csv", "data.path={tmp}/latin1.csv", *RUN], 2,
         ["latin1.csv", "not UTF-8", "byte"], write("latin1.csv", "label,f\u00e9\n1,2\n".encode("latin-1"))),
    Case("csv_random_bytes", [*FIT, "data.name=csv", "data.path={tmp}/r.csv", *RUN], 2, ["r.csv", "not UTF-8"],
         write("r.csv", RANDOM_BYTES)),
    Case("csv_only_the_label", [*FIT, "data.name=csv", "data.path={tmp}/l.csv", *RUN], 2,
         ["l.csv", "feature column"], write("l.csv", "label\n1\n0\n")),
    Case("csv_not_numbers", [*FIT, "data.name=csv", "data.path={tmp}/w.csv", *RUN], 2, ["w.csv:3", "not a number"],
         write("w.csv", "label,a\n1,2\n0,abc\n")),
    # an unreadable data file (chmod 000) is covered by tests/unit/test_user_input_errors.py with a faked
    # PermissionError: the suite runs as root here, which reads any file, and a skipped case proves nothing
    Case("data_path_is_a_folder", [*FIT, "data.name=npz", "data.path={tmp}/dir", *RUN], 2, ["dir", "is a folder"],
         write("dir/x.npz", b"")),
    Case("data_path_missing", [*FIT, "data.name=npz", "data.path={tmp}/nope.npz", *RUN], 2, ["nope.npz", "not found"]),

    # ---- data: splits and sizes ----
    Case("val_split_empties_train", [*FIT, "data.name=npz", "data.path={tmp}/three.npz", "data.test_split=0",
                                     "data.val_split=0.6", *RUN], 2, ["data.val_split", "train split empty"],
         npz("three.npz", x=X[:3], y=np.arange(3)), absent=NO_RUN),
    Case("test_split_empties_train", [*FIT, "data.name=npz", "data.path={tmp}/three.npz", "data.test_split=0.6",
                                      *RUN], 2, ["data.test_split", "no training samples"],
         npz("three.npz", x=X[:3], y=np.arange(3))),
    Case("mnist1d_one_sample", [*FIT, "data.name=mnist1d", "data.num_samples=1", *RUN], 2,
         ["data.num_samples", ">= 100"], absent=NO_RUN),
    Case("text_kwargs_not_numbers", [*FIT, "data.name=text", "model.name=charlm", "data.kwargs.seq_len=abc", *RUN], 2,
         ["data.kwargs.seq_len", "integer"]),

    # ---- import paths: data.name, model.name, callbacks ----
    Case("data_module_raises_on_import", [*FIT, "data.name=broken_mod:Data", *RUN], 2,
         ["data.name", "broken_mod", "RuntimeError", "this module fails when imported"], RAISES_ON_IMPORT,
         env=PYPATH, absent=NO_RUN),
    Case("model_module_raises_on_import", [*FIT, "model.name=broken_mod:Net", *RUN], 2,
         ["model.name", "broken_mod", "RuntimeError"], RAISES_ON_IMPORT, env=PYPATH),
    Case("callback_module_raises_on_import", [*FIT, "callbacks=[{path: 'broken_mod:Cb'}]", *RUN], 2,
         ["callbacks.path", "broken_mod", "RuntimeError"], RAISES_ON_IMPORT, env=PYPATH),
    Case("data_module_missing", [*FIT, "data.name=no_such_module_xyz:Data", *RUN], 2,
         ["data.name", "No module named 'no_such_module_xyz'"]),
    Case("data_attribute_missing", [*FIT, "data.name=userdata:Nope", *RUN], 2, ["has no attribute 'Nope'"], DS,
         env=PYPATH),
    Case("dataset_factory_raises", [*FIT, "data.name=userdata:FactoryRaises", *RUN], 2,
         ["userdata:FactoryRaises", "ValueError", "factory refuses"], DS, env=PYPATH, absent=NO_RUN),
    Case("dataset_getitem_raises", [*FIT, "data.name=userdata:ItemRaises", *RUN], 2, ["item 7", "KeyError"], DS,
         env=PYPATH),
    Case("dataset_len_raises", [*FIT, "data.name=userdata:LenRaises", *RUN], 2, ["len()", "no length"], DS,
         env=PYPATH),
    Case("dataset_items_not_pairs", [*FIT, "data.name=userdata:NotPairs", *RUN], 2, ["item 0", "(x, y) pair"], DS,
         env=PYPATH),
    Case("dataset_mixed_shapes", [*FIT, "data.name=userdata:MixedShapes", *RUN], 2, ["item 5", "same shape"], DS,
         env=PYPATH),
    Case("dataset_label_out_of_range", [*FIT, "data.name=userdata:LabelTooBig", *RUN], 2,
         ["label 5 at row 9", "class ids from 0 to 2"], DS, env=PYPATH),
    Case("model_constructor_raises", [*FIT, "model.name=userdata:CtorRaises", *RUN], 2,
         ["model.name", "userdata:CtorRaises", "RuntimeError", "licence key"], DS, env=PYPATH),
    Case("callback_constructor_raises", [*FIT, "callbacks=[{path: 'userdata:CtorRaises'}]", *RUN], 2,
         ["callbacks", "userdata:CtorRaises", "RuntimeError", "licence key"], DS, env=PYPATH),
    Case("dataset_factory_works", [*FIT, "data.name=userdata:make_base", *RUN], 0, ["test_accuracy"], DS,
         env=PYPATH, may_change=("run/**",)),

    # ---- checkpoints: a newest one whose files were swapped with the manifest made to match ----
    Case("newest_checkpoint_tensors_random_manifest_updated", ["resume", "{tmp}/run"], 0,
         ["skipping checkpoint", "step-00000004", "not a readable safetensors file", "step-00000002"],
         both(trained_run(), replace_tensors("run", 4, lambda t: RANDOM_BYTES)),
         may_change=("run/*", "run/checkpoints/step-00000004/*")),
    Case("newest_checkpoint_tensors_swapped_manifest_updated", ["resume", "{tmp}/run"], 0,
         ["skipping checkpoint", "step-00000004", "lacks", "meta.json", "step-00000002"],
         both(trained_run(), replace_tensors("run", 4, lambda t: (t / "run/model.safetensors").read_bytes())),
         may_change=("run/*", "run/checkpoints/step-00000004/*")),
    Case("resume_from_a_broken_checkpoint", [*FIT, "--run-dir", "{tmp}/new", "--resume",
                                             "{tmp}/run/checkpoints/step-00000004"], 3,
         ["step-00000004", "not a readable safetensors file"],
         both(trained_run(), replace_tensors("run", 4, lambda t: RANDOM_BYTES)), absent=("new",)),

    # ---- --init-from ----
    Case("init_from_random_safetensors", [*FIT, *RUN, "--init-from", "{tmp}/w.safetensors"], 3,
         ["w.safetensors", "not a readable safetensors file"], write("w.safetensors", RANDOM_BYTES), absent=NO_RUN),
    Case("init_from_random_bin", [*FIT, *RUN, "--init-from", "{tmp}/w.bin"], 3, ["w.bin", "weights_only=True"],
         write("w.bin", RANDOM_BYTES), absent=NO_RUN),
    Case("init_from_empty_safetensors", [*FIT, *RUN, "--init-from", "{tmp}/e.safetensors"], 3,
         ["e.safetensors", "not a readable safetensors file"], write("e.safetensors", b"")),
    Case("init_from_a_run_folder", [*FIT, "--run-dir", "{tmp}/new", "--init-from", "{tmp}/src"], 0,
         ["a run folder", "best weights", "model.safetensors"], trained_run("src"), may_change=("new/**",)),
    Case("init_from_a_run_folder_keep_optimizer", [*FIT, "--run-dir", "{tmp}/new", "--init-from", "{tmp}/src",
                                                   "--keep-optimizer"], 0,
         ["a run folder", "newest valid checkpoint", "step-00000004"], trained_run("src"), may_change=("new/**",)),
    Case("init_from_a_runs_checkpoints_folder", [*FIT, "--run-dir", "{tmp}/new", "--init-from",
                                                 "{tmp}/src/checkpoints"], 0,
         ["newest valid checkpoint", "step-00000004"], trained_run("src"), may_change=("new/**",)),
    Case("init_from_a_run_folder_without_weights", [*FIT, *RUN, "--init-from", "{tmp}/src"], 3,
         ["src", "run folder", "no weights to start from"], write("src/config.yaml", "name: x\n"), absent=NO_RUN),
    Case("init_from_a_plain_folder", [*FIT, *RUN, "--init-from", "{tmp}/stuff"], 3,
         ["stuff", "not a checkpoint folder"], write("stuff/notes.txt", "hello"), absent=NO_RUN),

    # ---- compare / ledger on folders that are not runs ----
    Case("compare_non_run_folder", ["compare", "{tmp}/stuff", "{tmp}/stuff"], 2,
         ["stuff", "not a run folder", "summary.json"], write("stuff/notes.txt", "hello")),
    Case("compare_missing_folder", ["compare", "{tmp}/nope", "{tmp}/nope"], 2, ["nope", "not a run folder"]),
    Case("compare_a_file", ["compare", "{tmp}/tiny.yaml", "{tmp}/tiny.yaml"], 2, ["tiny.yaml", "summary.json"]),
    Case("compare_summary_not_json", ["compare", "{tmp}/r", "{tmp}/r"], 2, ["summary.json", "not readable JSON"],
         both(write("r/config.yaml", "name: x\n"), write("r/summary.json", RANDOM_BYTES))),
    Case("ledger_non_run_folder", ["ledger", "{tmp}/stuff"], 2, ["stuff", "not a run folder", "ledger.json"],
         write("stuff/notes.txt", "hello")),
    Case("ledger_not_json", ["ledger", "{tmp}/r"], 2, ["ledger.json", "not readable JSON"],
         both(write("r/config.yaml", "name: x\n"), write("r/ledger.json", "{not json"))),
]


def by_id(cases: Sequence[Case]) -> dict[str, Case]:
    out = {}
    for c in cases:
        assert c.id not in out, f"duplicate case id {c.id}"
        out[c.id] = c
    return out


def fill(text: str, tmp: Path) -> str:
    return text.replace("{tmp}", str(tmp))


def is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


# ---- run folders: resumed, refused, or replaced only under --overwrite; nothing lost (docs/reliability.md) ----
CASES += [
    Case("fit_into_a_finished_run", ["fit", "{tmp}/tiny.yaml", "--run-dir", "{tmp}/run"], 2,
         ["already holds a run", "--resume auto", "fresh --run-dir", "--overwrite"], trained_run(), isolated=True),
    Case("fit_into_a_partial_run", ["fit", "{tmp}/tiny.yaml", "--run-dir", "{tmp}/run"], 2,
         ["already holds a run", "metrics.jsonl"], both(write("run/config.yaml", "name: x\n"),
                                                        write("run/metrics.jsonl", '{"step": 2}\n'))),
    Case("fit_overwrite_replaces_the_run", ["fit", "{tmp}/tiny.yaml", "--run-dir", "{tmp}/run", "--overwrite", "--quiet"],
         0, ["test_accuracy"], trained_run(), may_change=["run/**"]),
    Case("resume_auto_of_a_finished_run_without_checkpoints",
         ["fit", "{tmp}/tiny.yaml", "--run-dir", "{tmp}/run", "--resume", "auto"], 2,
         ["finished run without a valid checkpoint", "--overwrite"],
         trained_run("run", "checkpoint.at_end=false", "checkpoint.every_n_steps=null")),
    Case("resume_refused_config_change_keeps_the_folder", ["resume", "{tmp}/run", "loop.max_steps=25"], 2,
         ["config differs", "loop.max_steps", "--allow-config-change"], trained_run()),
    Case("resume_failing_on_the_weights_keeps_the_folder",
         ["resume", "{tmp}/run", "model.kwargs.hidden=[8]", "--allow-config-change"], 3,
         ["different model", "shape"], trained_run()),
    Case("resume_with_no_checkpoints", ["resume", "{tmp}/run"], 3, ["checkpoints", "empty or missing", "--overwrite"],
         trained_run("run", "checkpoint.at_end=false", "checkpoint.every_n_steps=null")),
    Case("refused_resume_leaves_no_new_folder",
         ["fit", "{tmp}/tiny.yaml", "--run-dir", "{tmp}/run", "--resume", "{tmp}/nope"], 3, ["nope"], absent=NO_RUN),
    Case("bad_init_from_leaves_no_new_folder",
         ["fit", "{tmp}/tiny.yaml", "--run-dir", "{tmp}/run", "--init-from", "{tmp}/w.safetensors"], 3,
         ["w.safetensors"], write("w.safetensors", RANDOM_BYTES), absent=NO_RUN),
    Case("run_dir_is_a_file", ["fit", "{tmp}/tiny.yaml", "--run-dir", "{tmp}/tiny.yaml"], 2,
         ["tiny.yaml", "is a file"]),
    Case("checkpoints_path_is_a_file", ["fit", "{tmp}/tiny.yaml", "--run-dir", "{tmp}/run"], 3,
         ["checkpoints", "is a file", "no checkpoint can be saved"], write("run/checkpoints", "not a folder")),
    Case("bad_data_leaves_no_new_folder", ["fit", "{tmp}/tiny.yaml", "--run-dir", "{tmp}/run", "data.val_split=0.9999"],
         2, ["val"], absent=NO_RUN),
]


# ---- eval / predict / bn-report (inference.py, methods/batchnorm.py): one line, nothing half-written ----
WIDE = npz("wide.npz", x=np.zeros((5, 10), np.float32), y=np.zeros(5, np.int64))
UNLABELLED = npz("u.npz", x=np.zeros((5, 64), np.float32))
NO_EVAL = ("run/eval-*", "run/.eval-*")
NO_PREDS = ("p.csv", ".p.csv.tmp-*")
PREDICT = ["predict", "{tmp}/run", "--out", "{tmp}/p.csv", "--data"]
CASES += [
    Case("eval_missing_target", ["eval", "{tmp}/nope"], 2, ["nope", "not found"]),
    Case("eval_not_a_run", ["eval", "{tmp}/stuff"], 2, ["stuff", "not a run folder", "config.yaml", "MANIFEST.json"],
         write("stuff/notes.txt", "hello")),
    Case("eval_a_file", ["eval", "{tmp}/tiny.yaml"], 2, ["tiny.yaml", "a file", "not a run folder"]),
    Case("eval_unfinished_run", ["eval", "{tmp}/run"], 2, ["run", "no model.safetensors", "not finished"],
         write("run/config.yaml", "name: x\n"), absent=NO_EVAL),
    Case("eval_wrong_feature_width", ["eval", "{tmp}/run", "--data", "{tmp}/wide.npz"], 2,
         ["wide.npz", "10 features", "trained on 64 features"], both(trained_run(), WIDE), absent=NO_EVAL),
    Case("eval_missing_data_file", ["eval", "{tmp}/run", "--data", "{tmp}/nope.npz"], 2, ["nope.npz", "not found"],
         trained_run(), absent=NO_EVAL),
    Case("eval_labels_out_of_range", ["eval", "{tmp}/run", "--data", "{tmp}/big.npz"], 2,
         ["big.npz", "label 12", "10 classes"],
         both(trained_run(), npz("big.npz", x=np.zeros((5, 64), np.float32), y=np.full(5, 12))), absent=NO_EVAL),
    Case("eval_unlabelled_file", ["eval", "{tmp}/run", "--data", "{tmp}/u.npz"], 2, ["u.npz", "missing array 'y'"],
         both(trained_run(), UNLABELLED), absent=NO_EVAL),
    Case("eval_bad_data_override", ["eval", "{tmp}/run", "--data", "batch_size=-1"], 2, ["data.batch_size"],
         trained_run(), absent=NO_EVAL),
    Case("eval_corrupt_weights", ["eval", "{tmp}/run"], 3, ["model.safetensors", "not a readable safetensors"],
         both(trained_run(), write("run/model.safetensors", RANDOM_BYTES)), absent=NO_EVAL),
    Case("eval_weights_of_another_model", ["eval", "{tmp}/run"], 3, ["different model", "shape"],
         both(trained_run(), trained_run("other", "model.kwargs.hidden=[8]"), copy("other/model.safetensors",
                                                                                 "run/model.safetensors")),
         may_change=["run/model.safetensors"], absent=NO_EVAL),
    Case("eval_a_run", ["eval", "{tmp}/run"], 0, ["test_accuracy", "eval mode", "eval-test.json"], trained_run()),
    Case("predict_wrong_feature_width", [*PREDICT, "{tmp}/wide.npz"], 2, ["wide.npz", "10 features", "64 features"],
         both(trained_run(), WIDE), absent=NO_PREDS),
    Case("predict_missing_data_file", [*PREDICT, "{tmp}/nope.csv"], 2, ["nope.csv", "not found"], trained_run(),
         absent=NO_PREDS),
    Case("predict_not_a_data_file", [*PREDICT, "{tmp}/tiny.yaml"], 2, ["tiny.yaml", "not a .npz or .csv"],
         trained_run(), absent=NO_PREDS),
    Case("predict_out_is_a_folder", ["predict", "{tmp}/run", "--data", "{tmp}/u.npz", "--out", "{tmp}/run"], 2,
         ["--out", "is a folder"], both(trained_run(), UNLABELLED)),
    Case("predict_out_in_a_missing_folder", ["predict", "{tmp}/run", "--data", "{tmp}/u.npz", "--out",
                                             "{tmp}/no/p.csv"], 2, ["--out", "does not exist"],
         both(trained_run(), UNLABELLED), absent=("no",)),
    Case("predict_from_a_missing_run", [*PREDICT, "{tmp}/u.npz"], 2, ["run", "not found"], UNLABELLED,
         absent=NO_PREDS),
    Case("predict_unlabelled_file", [*PREDICT, "{tmp}/u.npz"], 0, ["wrote 5 predictions"],
         both(trained_run(), UNLABELLED)),
    Case("bn_report_not_a_run", ["bn-report", "{tmp}/stuff"], 2, ["stuff", "summary.json"],
         write("stuff/notes.txt", "hello")),
    Case("bn_report_without_the_method", ["bn-report", "{tmp}/run"], 2, ["without the batchnorm method"],
         trained_run()),
    Case("fit_batchnorm_on_a_model_without_batchnorm", [*FIT, *RUN, "methods=[{name: batchnorm}]"], 2,
         ["methods.batchnorm", "no BatchNorm layers"], absent=NO_RUN),
    Case("fit_groupnorm_groups_not_dividing", ["fit", "{tmp}/gn.yaml", *RUN], 2, ["groups=8", "12 channels", "stem.1"],
         write("gn.yaml", TINY.replace("{name: mlp, kwargs: {hidden: [16]}}", "{name: resnet, kwargs: {widths: [12]}}")
               + "methods: [{name: batchnorm, policy: groupnorm, groups: 8}]\n"), absent=NO_RUN),
    Case("fit_batchnorm_momentum_without_value", [*FIT, *RUN, "methods=[{name: batchnorm, policy: momentum}]"], 2,
         ["methods.0.batchnorm", "needs a value"], absent=NO_RUN),
    Case("fit_finetune_pattern_matching_nothing", [*FIT, *RUN, "methods=[{name: finetune, freeze: [encoder]}]"], 2,
         ["methods.finetune.freeze", "'encoder' matches no parameter"], absent=NO_RUN),
]


# ---- config: YAML, dotted overrides, cross-field rules (config/__init__.py): one line naming the key ----
CASES += [
    Case("recipe_unclosed_yaml", ["fit", "{tmp}/unclosed.yaml", *RUN], 2, ["unclosed.yaml", "line 3", "not valid YAML"],
         write("unclosed.yaml", "name: x\ndata: {name: digits\nmodel: {name: mlp}\n"), absent=NO_RUN),
    Case("recipe_date_out_of_range", ["fit", "{tmp}/date.yaml", *RUN], 2, ["date.yaml", "not valid YAML", "month"],
         write("date.yaml", TINY + "seed: 2024-13-45\n"), absent=NO_RUN),
    Case("override_unknown_key", [*FIT, "optim.lrr=0.1", *RUN], 2, ["'optim.lrr'", "unknown key"], absent=NO_RUN),
    Case("override_batch_size_not_a_number", [*FIT, "data.batch_size=abc", *RUN], 2,
         ["'data.batch_size'", "valid integer", "'abc'"], absent=NO_RUN),
    Case("override_batch_size_zero", [*FIT, "data.batch_size=0", *RUN], 2, ["'data.batch_size'", "greater than 0"],
         absent=NO_RUN),
    Case("override_val_split_above_one", [*FIT, "data.val_split=1.5", *RUN], 2, ["'data.val_split'", "less than 1"],
         absent=NO_RUN),
    Case("override_section_set_to_a_number", [*FIT, "optim=5", *RUN], 2, ["'optim'", "valid dictionary", "(got 5)"],
         absent=NO_RUN),
    Case("override_without_equals", [*FIT, "bogus", *RUN], 2, ["'bogus'", "key.sub=value"], absent=NO_RUN),
    Case("override_empty_key_part", [*FIT, ".a=1", *RUN], 2, ["'.a=1'", "empty key part"], absent=NO_RUN),
    # a YAML date out of range is kept as the string it is, then refused by the key's type
    Case("override_date_out_of_range", [*FIT, "seed=2024-13-45", *RUN], 2, ["'seed'", "valid integer", "2024-13-45"],
         absent=NO_RUN),
    Case("fsdp_without_torchrun", [*FIT, "distributed.strategy=fsdp", *RUN], 2, ["distributed.strategy=fsdp",
                                                                                "needs torchrun"], absent=NO_RUN),
    Case("method_listed_twice", [*FIT, "methods=[{name: ema}, {name: ema}]", *RUN], 2, ["'ema'", "listed twice"],
         absent=NO_RUN),
]


# ---- data: arrays that disagree, on-disk sources (data/shards.py, data/hf.py), a changed file on resume ----
def parquet(name: str, **columns) -> Callable[[Path], None]:
    def setup(tmp: Path) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table(columns), tmp / name)
    return setup


def tars(name: str, cut: Optional[int] = None) -> Callable[[Path], None]:
    """A WebDataset-style tar shard of X/Y (`NNNNNN.npy` + `NNNNNN.cls`), cut to `cut` bytes when given."""
    def setup(tmp: Path) -> None:
        import io
        import tarfile

        path = tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(path, "w") as tar:
            for i, (x, y) in enumerate(zip(X, Y)):
                buf = io.BytesIO()
                np.save(buf, x)
                for member, data in ((f"{i:06d}.npy", buf.getvalue()), (f"{i:06d}.cls", str(int(y)).encode())):
                    info = tarfile.TarInfo(member)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        if cut is not None:
            path.write_bytes(path.read_bytes()[:cut])
    return setup


NPZ = ["data.name=npz", "data.path={tmp}/d.npz"]
TRAIN_NPZ = npz("d.npz", x=X, y=Y)  # one object: trained_run's key (see its docstring)
SHARD = dict(a=X[:, 0], b=X[:, 1], label=Y)
CASES += [
    Case("npz_empty_arrays", [*FIT, *NPZ, *RUN], 2, ["d.npz", "no samples"],
         npz("d.npz", x=np.zeros((0, 4), np.float32), y=np.zeros(0, np.int64)), absent=NO_RUN),
    Case("npz_more_rows_than_labels", [*FIT, *NPZ, *RUN], 2, ["d.npz", "60 feature rows but 50 labels"],
         npz("d.npz", x=X, y=Y[:50]), absent=NO_RUN),
    Case("resume_after_the_data_changed", ["resume", "{tmp}/run"], 2,
         ["dataset content hash", "--allow-config-change"],
         both(trained_run("run", "data.name=npz", "data.path=d.npz", inputs=TRAIN_NPZ), npz("d.npz", x=X + 1, y=Y))),
    Case("parquet_path_is_a_file", [*FIT, "data.name=parquet:{tmp}/p/a.parquet", *RUN], 2,
         ["a.parquet", "not a folder", "folder of .parquet shards"], parquet("p/a.parquet", **SHARD), absent=NO_RUN),
    Case("parquet_shard_random_bytes", [*FIT, "data.name=parquet:{tmp}/p", *RUN], 2,
         ["b.parquet", "not a readable Parquet shard"],
         both(parquet("p/a.parquet", **SHARD), write("p/b.parquet", RANDOM_BYTES)), absent=NO_RUN),
    Case("parquet_schema_differs", [*FIT, "data.name=parquet:{tmp}/p", *RUN], 2,
         ["b.parquet", "schema differs from a.parquet", "column 'b'"],
         both(parquet("p/a.parquet", **SHARD), parquet("p/b.parquet", a=X[:, 0], b=Y, label=Y)), absent=NO_RUN),
    Case("shards_pattern_matches_nothing", [*FIT, "data.name=shards:{tmp}/s/train-*.tar", *RUN], 2,
         ["shards:", "matches no .tar, .parquet or .bin file"], write("s/notes.txt", "hello"), absent=NO_RUN),
    Case("shards_brace_range_names_a_missing_shard", [*FIT, "data.name=shards:{tmp}/s/t-{0..2}.tar", *RUN], 2,
         ["no such shard file or folder", "t-2.tar"], both(tars("s/t-0.tar"), tars("s/t-1.tar")), absent=NO_RUN),
    Case("shards_tar_truncated", [*FIT, "data.name=shards:{tmp}/s", *RUN], 2,
         ["b.tar", "truncated", "at byte", "on_bad_shard=skip"], both(tars("s/a.tar"), tars("s/b.tar", cut=3000)),
         absent=NO_RUN),
    Case("shards_tar_random_bytes", [*FIT, "data.name=shards:{tmp}/s", *RUN], 2,
         ["b.tar", "not a readable tar shard"], both(tars("s/a.tar"), write("s/b.tar", RANDOM_BYTES)), absent=NO_RUN),
    Case("shards_mixed_kinds", [*FIT, "data.name=shards:{tmp}/s", *RUN], 2, ["one kind per run"],
         both(tars("s/a.tar"), parquet("s/b.parquet", **SHARD)), absent=NO_RUN),
    Case("shards_on_bad_shard_unknown", [*FIT, "data.on_bad_shard=ignore", *RUN], 2, ["on_bad_shard", "'fail'"],
         absent=NO_RUN),
    Case("hf_not_a_saved_dataset", [*FIT, "data.name=hf:{tmp}/stuff", *RUN], 2,
         ["stuff", "not a saved dataset", "save_to_disk"], write("stuff/notes.txt", "hello"), absent=NO_RUN),
    Case("persistent_workers_without_workers", [*FIT, "data.persistent_workers=true", *RUN], 2,
         ["'data'", "persistent_workers needs data.workers > 0"], absent=NO_RUN),
]
