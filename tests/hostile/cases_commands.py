"""The hostile corpus, second part: every method's inputs, and the commands added with the methods
engine (fit --seeds, lr-find, the registry's update/versions/promote/rollback/review-queue, the speech
example), run folders behind symlinks, and checkpoints and security (a pickle that runs code, flipped
bits). The harness and the first families are in cases.py."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Callable

import numpy as np

from tests.hostile.cases import (FIT, NO_RUN, NPZ, RUN, TINY, TRAIN_NPZ, Case, both, npz, trained_run,
                                 write)

CASES: list[Case] = []


# ---- methods: what each method reads (from, teacher, reference) and the models it fits ----
def methods(*entries: str) -> str:
    return f"methods=[{', '.join(entries)}]"


MLP_MODEL = "{name: mlp, kwargs: {hidden: [16]}}"
CNN = write("cnn.yaml", TINY.replace(MLP_MODEL, "{name: cnn, kwargs: {channels: 8}}"))
RESNET = write("resnet.yaml", TINY.replace(MLP_MODEL, "{name: resnet, kwargs: {widths: [8]}}"))
CASES += [
    Case("replay_from_missing", [*FIT, *RUN, methods("{name: replay, from: '{tmp}/nope'}")], 2,
         ["methods.replay.from", "nope", "not found"], absent=NO_RUN),
    Case("adapters_target_matches_nothing", [*FIT, *RUN, methods("{name: adapters, target_modules: [nope]}")], 2,
         ["methods.adapters.target_modules", "nope", "net.0"], absent=NO_RUN),
    Case("num_classes_below_the_labels", [*FIT, *NPZ, "data.num_classes=2", *RUN], 2,
         ["data.num_classes=2", "label 2", "from 0 to 1"], TRAIN_NPZ, absent=NO_RUN),
    Case("ewc_from_a_run_without_exports", [*FIT, *RUN, methods("{name: ewc, from: '{tmp}/src'}")], 2,
         ["methods.ewc.from", "src", "trained with methods.ewc"], trained_run("src"), absent=NO_RUN),
    Case("progressive_resize_on_cnn", ["fit", "{tmp}/cnn.yaml", *RUN, methods("{name: progressive_resize}")], 2,
         ["methods.progressive_resize", "cannot take inputs of length", "pools over the length"], CNN, absent=NO_RUN),
    Case("batch_ramp_without_lr_scaling", [*FIT, *RUN, methods("{name: batch_ramp}")], 2,
         ["'methods.0.batch_ramp.lr_scaling'", "Field required"], absent=NO_RUN),
    Case("curriculum_reference_missing", [*FIT, *RUN, methods("{name: curriculum, reference: '{tmp}/nope'}")], 2,
         ["methods.curriculum.reference", "nope", "not a folder"], absent=NO_RUN),
    Case("distill_teacher_missing", [*FIT, *RUN, methods("{name: distill, teacher: '{tmp}/nope'}")], 2,
         ["methods.distill.teacher", "nope", "not found"], absent=NO_RUN),
    Case("distill_cache_with_augment", [*FIT, *RUN, "data.augment.noise=0.1", methods("{name: distill, teacher: "
                                                                                     "'{tmp}/src'}")], 2,
         ["methods.distill.cache", "data.augment", "cache: false"], trained_run("src"), absent=NO_RUN),
    Case("qat_on_a_conv_layer", ["fit", "{tmp}/cnn.yaml", *RUN, methods("{name: qat, modules: ['conv*']}")], 2,
         ["methods.qat.modules", "'conv1' is a Conv1d", "nn.Linear only"], CNN, absent=NO_RUN),
    Case("prune_structured_on_resnet", ["fit", "{tmp}/resnet.yaml", *RUN, methods("{name: prune, kind: structured}")],
         2, ["methods.prune kind=structured", "ResNet1d", "kind: unstructured"], RESNET, absent=NO_RUN),
]


# ---- commands: fit --seeds and group files (sweep.py), lr-find's options and --out (lrfind.py) ----
LR_FIND = ["lr-find", "{tmp}/tiny.yaml", "--steps", "10", "--out"]
NO_LR = ("lr.*", ".lr.*", "runs")
CASES += [
    Case("seeds_not_numbers", [*FIT, *RUN, "--seeds", "1,x"], 2, ["--seeds '1,x'", "0,1,2 or 0-4"],
         absent=("run*",)),
    Case("seeds_with_a_seed_override", [*FIT, *RUN, "--seeds", "0", "seed=3"], 2,
         ["--seeds sets each run's seed", "seed=..."], absent=("run*",)),
    Case("seeds_empty", [*FIT, *RUN, "--seeds", ""], 2, ["--seeds"], absent=("run*",)),
    Case("seeds_run_dir_inside_a_file", [*FIT, "--run-dir", "{tmp}/tiny.yaml/r", "--seeds", "0"], 2,
         ["--run-dir", "tiny.yaml is a file"]),
    Case("compare_group_not_json", ["compare", "{tmp}/a-group.json", "{tmp}/a-group.json"], 2,
         ["a-group.json", "not a readable group file"], write("a-group.json", "{nope")),
    Case("lr_find_too_few_steps", ["lr-find", "{tmp}/tiny.yaml", "--steps", "3", "--out", "{tmp}/lr.png"], 2,
         ["--steps 3", "at least 10"], absent=NO_LR),
    Case("lr_find_out_is_a_folder", [*LR_FIND, "{tmp}/d"], 2, ["--out", "is a folder", "lrfind.png"],
         write("d/x", ""), absent=NO_LR),
    Case("lr_find_out_inside_a_file", [*LR_FIND, "{tmp}/tiny.yaml/lr.png"], 2, ["--out", "tiny.yaml is a file"]),
    Case("lr_find_curve_path_is_a_folder", [*LR_FIND, "{tmp}/lr.png"], 2, ["lr.json is a folder", "another --out"],
         write("lr.json/x", ""), absent=("lr.png", ".lr.*")),
    Case("lr_find_out_is_json", [*LR_FIND, "{tmp}/lr.json"], 2, ["--out", "lr.json", ".png"], absent=NO_LR),
]


# ---- the continual registry: update, versions, promote, rollback, review-queue (cli/commands/update.py, versions.py, ...) ----
_REGISTRY: dict[str, Path] = {}


def registry(name: str = "reg") -> Callable[[Path], None]:
    """A registry at tmp/name with one version, v0001 (current): a tiny run added by `versions add` once a
    session (the real CLI, in a subprocess) and copied into each case's folder."""
    def setup(tmp: Path) -> None:
        import atexit
        import tempfile

        from tests.conftest import run_cli

        if "reg" not in _REGISTRY:
            home = Path(tempfile.mkdtemp(prefix="ecotrain-hostile-reg-"))
            atexit.register(shutil.rmtree, home, True)
            trained_run()(home)
            r = run_cli("versions", "add", home / "run", "--registry", home / "reg", cwd=home)
            assert r.returncode == 0, r.stderr
            _REGISTRY["reg"] = home / "reg"
        shutil.copytree(_REGISTRY["reg"], tmp / name)
    return setup


REG = ["--registry", "{tmp}/reg"]
NEW_DATA = npz("new.npz", x=np.zeros((20, 64), np.float32), y=np.arange(20) % 10)
CASES += [
    Case("update_without_registry", ["update", "current", "{tmp}/new.npz", *REG], 2,
         ["reg", "no registry here", "versions add"], NEW_DATA, absent=("reg",)),
    Case("update_base_with_dotdot", ["update", "../v0001", "{tmp}/new.npz", *REG], 2,
         ["'../v0001'", "not a version name"], NEW_DATA, absent=("reg",)),
    Case("rollback_without_registry", ["rollback", *REG], 2, ["reg", "no registry here"], absent=("reg",)),
    Case("promote_a_missing_version", ["promote", "v0007", *REG], 2, ["no version v0007", "versions: v0001"],
         registry()),
    Case("versions_show_dotdot", ["versions", "show", "../x", *REG], 2, ["'../x'", "not a version name"],
         absent=("reg",)),
    Case("versions_of_a_missing_registry", ["versions", *REG], 2, ["reg", "no registry here", "versions add RUN"],
         absent=("reg",)),
    Case("update_replay_without_a_buffer", ["update", "current", "{tmp}/new.npz", *REG, "methods=[{name: replay}]"], 2,
         ["methods.replay", "v0001 has no replay buffer", "not be protected", "from:"], both(registry(), NEW_DATA)),
    Case("review_queue_out_is_a_folder", ["review-queue", "{tmp}/run", "{tmp}/new.npz", "--out", "{tmp}/q.csv"], 2,
         ["--out", "q.csv", "is a folder"], both(trained_run(), NEW_DATA, write("q.csv/x", "")), absent=(".q.csv*",)),
]


# ---- speech (cli/commands/data.py, speech_feedback.py): refused before any espeak-ng generation or training ----
SPEECH_RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "speech_feedback.yaml"
SPEECH = write("speech.yaml", SPEECH_RECIPE.read_text())
FEEDBACK = ["speech-feedback", "{tmp}/speech.yaml", "--out", "{tmp}/out", "data.kwargs.folder={tmp}/sd"]
NO_SPEECH = ("sd", "out")
CASES += [
    Case("speech_data_out_is_a_file", ["data", "speech-digits", "--out", "{tmp}/tiny.yaml"], 2,
         ["tiny.yaml", "not a folder", "another --out"]),
    Case("speech_feedback_wrong_fraction_above_one", [*FEEDBACK, "data.kwargs.feedback.wrong_fraction=2"], 2,
         ["data.kwargs.feedback.wrong_fraction", "between 0 and 1"], SPEECH, absent=NO_SPEECH),
    Case("speech_feedback_unknown_round", [*FEEDBACK, "data.kwargs.feedback.rounds=[accent_fr]"], 2,
         ["cohort 'accent_fr'", "not in the data", "accent_de"], SPEECH, absent=NO_SPEECH),
    Case("speech_feedback_out_is_a_file", [*FEEDBACK[:3], "{tmp}/tiny.yaml", *FEEDBACK[4:]], 2,
         ["--out", "tiny.yaml", "is a file"], SPEECH, absent=NO_SPEECH),
]


# ---- run folders behind symlinks: the user's files there, and elsewhere, are never lost (rundir.py) ----
def symlink(name: str, target: str) -> Callable[[Path], None]:
    def setup(tmp: Path) -> None:
        os.symlink(target, tmp / name)
    return setup


def relink(name: str, target: str) -> Callable[[Path], None]:
    """tmp/name made a link to target, whatever was there before."""
    def setup(tmp: Path) -> None:
        p = tmp / name
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        elif p.exists() or p.is_symlink():
            p.unlink()
        os.symlink(target, p)
    return setup


def unlink(name: str) -> Callable[[Path], None]:
    def setup(tmp: Path) -> None:
        (tmp / name).unlink()
    return setup


def move(src: str, dst: str) -> Callable[[Path], None]:
    def setup(tmp: Path) -> None:
        (tmp / dst).parent.mkdir(parents=True, exist_ok=True)
        shutil.move(tmp / src, tmp / dst)
    return setup


CASES += [
    Case("run_dir_symlink_to_a_users_folder", [*FIT, "--run-dir", "{tmp}/link", "--quiet"], 0, ["test_accuracy"],
         both(write("mine/notes.txt", "my notes"), symlink("link", "mine"))),
    Case("overwrite_keeps_a_symlinked_checkpoints_target", [*FIT, *RUN, "--overwrite", "--quiet"], 0,
         ["test_accuracy"], both(trained_run(), move("run/checkpoints", "elsewhere/ckpts"),
                                 write("elsewhere/ckpts/user.txt", "mine"),
                                 symlink("run/checkpoints", "../elsewhere/ckpts")), may_change=("run/**",)),
    Case("run_dir_dangling_symlink", [*FIT, "--run-dir", "{tmp}/link", "--quiet"], 2, ["link"],
         symlink("link", "gone")),
    Case("run_dir_inside_a_file", [*FIT, "--run-dir", "{tmp}/tiny.yaml/run"], 2, ["tiny.yaml"]),
    # the lock files (filelock.py): never written through a link (as root: any file), never a folder
    Case("run_lock_is_a_symlink_to_a_users_file", [*FIT, *RUN, "--resume", "auto"], 2,
         ["run/.ecotrain.lock", "symbolic link", "precious.txt", "remove the link"],
         both(trained_run(), write("precious.txt", "user data\n"), relink("run/.ecotrain.lock", "../precious.txt"))),
    Case("run_lock_is_a_folder", [*FIT, *RUN, "--resume", "auto"], 2, [".ecotrain.lock", "is a folder"],
         both(trained_run(), relink("run/.ecotrain.lock", "nothing"), unlink("run/.ecotrain.lock"),
              write("run/.ecotrain.lock/x", "x"))),
    Case("registry_lock_is_a_symlink", ["rollback", "--registry", "{tmp}/reg"], 2,
         ["registry.lock", "symbolic link", "remove the link"],
         both(registry(), write("precious.txt", "user data\n"), relink("reg/registry.lock", "../precious.txt")),
         may_change=()),
]


# ---- values the config accepts only if the code can use them; YAML that would hang or mislead (config/__init__.py) ----
BOMB = """\
a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]
b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]
c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]
d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]
e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]
f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]
g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f]
h: &h [*g, *g, *g, *g, *g, *g, *g, *g, *g]
i: &i [*h, *h, *h, *h, *h, *h, *h, *h, *h]
"""
CASES += [
    Case("recipe_key_given_twice", ["fit", "{tmp}/dup.yaml", *RUN], 2, ["dup.yaml", "line 4", "'lr' is given twice",
                                                                        "line 3"],
         write("dup.yaml", "name: dup\noptim:\n  lr: 0.1\n  lr: 0.2\n"), absent=NO_RUN),
    Case("recipe_billion_laughs", ["fit", "{tmp}/bomb.yaml", *RUN], 2, ["bomb.yaml", "billion laughs"],
         write("bomb.yaml", BOMB), absent=NO_RUN),
    Case("seed_past_what_the_sampler_takes", [*FIT, *RUN, "seed=9223372036854775807"], 2,
         ["'seed'", "less than 4294967296"], absent=NO_RUN),
    Case("seeds_range_too_large_to_expand", [*FIT, *RUN, "--seeds", "0-99999999999"], 2,
         ["--seeds", "100,000,000,000 seeds", "at most 1000"], absent=("run*",)),
]


def edit_json(name: str, key: str, value) -> Callable[[Path], None]:
    """Hand-edit one top-level key of a JSON run file."""
    def setup(tmp: Path) -> None:
        import json

        p = tmp / name
        d = json.loads(p.read_text())
        d[key] = value
        p.write_text(json.dumps(d))
    return setup


CASES += [
    Case("compare_summary_text_for_a_number", ["compare", "{tmp}/run", "{tmp}/run"], 2,
         ["run/summary.json", "'test_accuracy' is \"high\"", "not a number"],
         both(trained_run(), edit_json("run/summary.json", "test_accuracy", "high"))),
    Case("compare_ledger_text_for_a_number", ["compare", "{tmp}/run", "{tmp}/run"], 2,
         ["run/ledger.json", "'cpu_seconds' is \"lots\"", "not a number"],
         both(trained_run(), edit_json("run/ledger.json", "cpu_seconds", "lots"))),
]


# ---- file-system errors anywhere (the CLI's boundary, errors.os_error_line): one line naming the path asked for ----
LONG = "y" * 300  # a name over the 255 bytes a file system allows
CASES += [
    Case("run_dir_under_proc", [*FIT, "--run-dir", "/proc/self/x"], 2, ["/proc/self/x", "No such file or directory",
                                                                        "choose another path"]),
    Case("report_out_name_too_long", ["report", "{tmp}/run", "--out", "{tmp}/" + LONG + ".html"], 2,
         [LONG + ".html", "File name too long", "255 bytes a name"], trained_run()),
    Case("lr_find_out_name_too_long", [*LR_FIND, "{tmp}/" + LONG + ".png"], 2, ["File name too long"]),
]


# ---- an --out onto a file the command reads, or a run's or checkpoint's own file (rundir.refuse_overwriting) ----
U_NPZ = npz("u.npz", x=np.zeros((5, 64), np.float32))
STEP4_DIR = "run/checkpoints/step-00000004"
CASES += [
    Case("predict_out_is_its_own_data", ["predict", "{tmp}/run", "--data", "{tmp}/u.npz", "--out", "{tmp}/u.npz"], 2,
         ["--out", "u.npz", "is the input", "choose another --out"], both(trained_run(), U_NPZ)),
    Case("eval_out_is_the_runs_config", ["eval", "{tmp}/run", "--out", "{tmp}/run/config.yaml"], 2,
         ["--out", "config.yaml of the run", "choose another --out"], trained_run(), absent=("run/eval-*",)),
    Case("report_out_is_the_runs_summary", ["report", "{tmp}/run", "--out", "{tmp}/run/summary.json"], 2,
         ["--out", "summary.json of the run"], trained_run()),
    Case("predict_out_into_a_checkpoint", ["predict", "{tmp}/run", "--data", "{tmp}/u.npz", "--out",
                                           "{tmp}/" + STEP4_DIR + "/p.csv"], 2,
         ["--out", "inside the checkpoint", "step-00000004"], both(trained_run(), U_NPZ),
         absent=(STEP4_DIR + "/p.csv", STEP4_DIR + "/.p.csv*")),
]


# ---- checkpoints and security: a pickle that runs code, flipped bits (checksums), no valid checkpoint ----
class _RunsCode:
    """Unpickled, this runs `touch MARKER`: `--init-from` must refuse it (weights_only=True), never run it."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch '{self.marker}'",)


def pickle_that_runs_code(name: str) -> Callable[[Path], None]:
    def setup(tmp: Path) -> None:
        import torch

        torch.save({"net.0.weight": _RunsCode(tmp / "PWNED")}, tmp / name)
    return setup


def flip_byte(rel: str, offset: int = -9) -> Callable[[Path], None]:
    """One bit pattern flipped in a file (the manifest is left as it was: its checksum must catch it)."""
    def setup(tmp: Path) -> None:
        data = bytearray((tmp / rel).read_bytes())
        data[offset] ^= 0xFF
        (tmp / rel).write_bytes(bytes(data))
    return setup


STEP4 = "run/checkpoints/step-00000004"
CASES += [
    Case("init_from_a_pickle_that_runs_code", [*FIT, *RUN, "--init-from", "{tmp}/evil.pt"], 3,
         ["evil.pt", "weights_only=True"], pickle_that_runs_code("evil.pt"), absent=("PWNED", "run")),
    Case("newest_checkpoint_bit_flipped", ["resume", "{tmp}/run"], 0,
         ["skipping checkpoint", "step-00000004", "does not match its checksum", "resuming from", "step-00000002"],
         both(trained_run(), flip_byte(f"{STEP4}/tensors.safetensors")), may_change=("run/*", f"{STEP4}/*")),
    Case("resume_from_a_bit_flipped_checkpoint", [*FIT, "--run-dir", "{tmp}/new", "--resume", "{tmp}/" + STEP4], 3,
         ["step-00000004", "tensors.safetensors does not match its checksum"],
         both(trained_run(), flip_byte(f"{STEP4}/tensors.safetensors")), absent=("new",)),
    Case("every_checkpoint_bit_flipped", ["resume", "{tmp}/run"], 3, ["checkpoints", "no valid checkpoint"],
         both(trained_run(), flip_byte(f"{STEP4}/tensors.safetensors"),
              flip_byte("run/checkpoints/step-00000002/tensors.safetensors"))),
]
