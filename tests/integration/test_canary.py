"""`ecotrain update --hold` then `ecotrain canary`: a candidate served beside current on recorded requests,
promoted, rejected or held by the rule on its intervals, every decision in the registry.

Real training (Split MNIST-1D, tiny), real serving one request at a time, real clocks; the decision rule
and the split are also checked on answers whose outcome is known (a candidate that sleeps is slower)."""

import json
import time

import numpy as np
import pytest

from ecotrain.cli import main
from ecotrain.continual.canary import CanaryRule, decide, figures, serve
from ecotrain.continual.registry import Registry
from tests.helpers.continual import base_world, ecotrain

TRAIN = ["loop.max_steps=40", "optim.lr=0.005"]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("canary")
    tasks = base_world(root, steps=60)
    z = np.load(tasks[0])
    np.savez(root / "requests.npz", x=z["x_test"], y=z["y_test"])  # task 0's traffic, with its later labels
    np.savez(root / "unlabelled.npz", x=z["x_test"])
    return root, tasks


def test_hold_then_canary_rejects_a_forgetful_candidate_and_promotes_a_faithful_one(world, capsys):
    root, tasks = world
    reg_dir = root / "registry"
    reg = Registry(reg_dir)
    R = ["--registry", reg_dir]
    assert ecotrain(capsys, "versions", "add", root / "base", *R)[0] == 0

    # naive fine-tuning on task 1, let through a lax gate but held: a candidate, current unchanged, exit 0
    code, out, err = ecotrain(capsys, "update", "current", tasks[1], *R, "--tolerance", "1.0", "--hold",
                              "methods=[]", *TRAIN)
    assert code == 0, out + err
    assert "v0002: candidate: passed the gate, held for the canary" in out
    assert reg.index()["current"] == "v0001" and reg.index()["versions"]["v0002"]["status"] == "candidate"

    # on task 0's recorded requests it forgot: rejected beyond doubt, current keeps serving, exit 1
    code, out, err = ecotrain(capsys, "canary", "v0002", root / "requests.npz", *R, "--max-latency-ratio", "5",
                              "--out", root / "c2.json")
    assert code == 1, out + err
    assert "decision=reject" in out and "v0002: canary: rejected, its metric is worse" in out
    idx = reg.index()
    assert idx["current"] == "v0001" and idx["versions"]["v0002"]["status"] == "rejected"
    rec = idx["versions"]["v0002"]["canary"]
    assert rec["decision"] == "reject" and rec["against"] == "v0001"
    assert rec["drop_interval"][0] > 0.01 and rec["requests"]["candidate"] == len(np.load(root / "requests.npz")["y"])
    assert idx["history"][-1]["canary"] == "v0002"
    written = json.loads((root / "c2.json").read_text())
    assert written["decision"] == "reject" and written["metric"]["current"] > written["metric"]["candidate"]

    # more training on task 0 itself: better on its traffic, promoted, exit 0
    code, out, err = ecotrain(capsys, "update", "current", tasks[0], *R, "--hold", "methods=[]", *TRAIN)
    assert code == 0, out + err
    code, out, err = ecotrain(capsys, "canary", "v0003", root / "requests.npz", *R, "--max-latency-ratio", "5",
                              "--max-drop", "0.05")
    assert code == 0, out + err
    assert "decision=promote" in out
    idx = reg.index()
    assert idx["current"] == "v0003" and idx["versions"]["v0003"]["status"] == "promoted"
    assert idx["history"][-1]["current"] == "v0003" and "canary: promoted" in idx["history"][-1]["reason"]
    # rollback goes back past it as after any promotion
    assert ecotrain(capsys, "rollback", *R)[0] == 0 and reg.index()["current"] == "v0001"


@pytest.fixture(scope="module")
def held(world):
    """A registry with v0001 current and v0002 held for the canary (nothing below changes it)."""
    root, tasks = world
    reg_dir = root / "registry-held"
    assert main(["versions", "add", str(root / "base"), "--registry", str(reg_dir)]) == 0
    assert main(["update", "current", str(tasks[0]), "--registry", str(reg_dir), "--hold", "methods=[]", *TRAIN]) == 0
    return reg_dir


@pytest.mark.parametrize("args, said", [
    (["current", "requests.npz"], "is current already"),
    (["v0009", "requests.npz"], "v0009"),
    (["v0002", "unlabelled.npz"], "no 'y' array"),
    (["v0002", "requests.npz", "--max-drop", "nan"], "--max-drop nan: must be a number"),
    (["v0002", "requests.npz", "--mode", "split", "--share", "0"], "--share 0.0: a split needs a share"),
    (["v0002", "requests.npz", "--max-latency-ratio", "0.5"], "--max-latency-ratio 0.5"),
    (["v0002", "requests.npz", "--seed", "-1"], "--seed -1"),
])
def test_refusals_are_one_line(world, held, capsys, args, said):
    root, _ = world
    capsys.readouterr()
    args = [root / a if a.endswith(".npz") else a for a in args]
    code, out, err = ecotrain(capsys, "canary", *args, "--registry", held)
    assert code == 2, out + err
    assert said in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert Registry(held).index()["versions"]["v0002"]["status"] == "candidate"  # nothing changed


def _sleepy(seconds: float, errors):
    def one(i):
        if seconds:
            time.sleep(seconds)
        return errors(i), 1.0
    return one


def test_a_slower_candidate_is_rejected_on_latency_alone():
    rule = CanaryRule(max_drop=0.01, max_latency_ratio=1.25)
    cur, cand = serve(200, rule, _sleepy(0.0, lambda i: i % 10 == 0), _sleepy(0.002, lambda i: i % 10 == 0))
    fig = figures(cur, cand, rule)
    assert fig["drop"] == 0 and fig["drop_interval"] == [0, 0]  # same answers, paired
    decision, reason = decide(fig, rule)
    assert decision == "reject" and "its latency is worse" in reason


def test_split_sends_the_share_and_compares_unpaired():
    rule = CanaryRule(mode="split", share=0.25, seed=3, max_latency_ratio=1e6)
    cur, cand = serve(2000, rule, _sleepy(0.0, lambda i: 0.0), _sleepy(0.0, lambda i: float(i % 5 == 0)))
    assert len(cur.errors) + len(cand.errors) == 2000 and 400 < len(cand.errors) < 600
    assert not set(cur.index) & set(cand.index)  # each request answered once
    fig = figures(cur, cand, rule)
    assert fig["drop"] == pytest.approx(0.2, abs=0.05) and fig["drop_interval"][0] > 0.1
    assert decide(fig, rule)[0] == "reject"


def test_too_few_requests_hold_and_say_how_many_would_decide():
    rule = CanaryRule(max_drop=0.15, max_latency_ratio=1e6)
    cur, cand = serve(40, rule, _sleepy(0.0, lambda i: float(i % 4 == 0)), _sleepy(0.0, lambda i: float(i % 4 == 1 or i % 9 == 0)))
    fig = figures(cur, cand, rule)
    decision, reason = decide(fig, rule)
    assert decision == "hold" and "requests to the candidate would decide" in reason
