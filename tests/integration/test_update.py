"""`ecotrain update` end to end on Split MNIST-1D (class-incremental, tiny): a base version, an update
the gate rejects (naive fine-tuning forgets task 0), one it promotes (replay from the base's
buffer), an adapter-only update, a rollback, the review queue, and a damaged version refused.

The commands go through the CLI's `main` in this process (one torch/PEFT import for the whole
sequence, as the hostile corpus does); tests/unit/test_registry.py runs real processes against one
registry."""

import json

import pytest

from ecotrain.continual.registry import Registry
from tests.helpers.continual import base_world, ecotrain

TRAIN = ["loop.max_steps=40", "optim.lr=0.005"]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("continual")
    return root, base_world(root, methods=[{"name": "replay", "size": 100}])


def test_update_gate_adapters_rollback(world, capsys):
    root, tasks = world
    reg_dir = root / "registry"
    reg = Registry(reg_dir)
    R = ["--registry", reg_dir]

    code, out, _ = ecotrain(capsys, "versions", "add", root / "base", *R)
    assert code == 0 and out.startswith("v0001: registered from run") and "(current)" in out
    base_acc = reg.read_meta("v0001")["metrics"]["tasks"]["base"]
    assert base_acc > 0.6  # task 0's test split, two classes

    # naive fine-tuning on task 1: learns it, forgets task 0 -> rejected, current unchanged, exit 1
    code, out, err = ecotrain(capsys, "update", "current", tasks[1], *R, "methods=[]", *TRAIN)
    assert code == 1, err
    assert "v0002: rejected: forgets the holdout" in out
    idx = reg.index()
    assert idx["current"] == "v0001" and idx["versions"]["v0002"]["status"] == "rejected"
    m2 = reg.read_meta("v0002")["metrics"]
    assert m2["tasks"]["base"] < base_acc - 0.1 and m2["forgetting"]["base"] > 0.1

    # replay from the base version's buffer (its export.safetensors, wired as `from`) -> promoted
    code, out, err = ecotrain(capsys, "update", "current", tasks[1], *R, "--tolerance", "0.35",
                              "methods=[{name: replay, size: 100, ratio: 0.5}]", *TRAIN)
    assert code == 0, out + err
    assert "v0003: promoted" in out
    meta3 = reg.read_meta("v0003")
    assert meta3["parent"] == "v0001" and reg.index()["current"] == "v0003"
    assert meta3["config"]["methods"][0]["from"] == str(reg.path("v0001") / "export.safetensors")
    assert (reg.path("v0003") / "export.safetensors").is_file()  # the buffer the next version replays
    m3 = meta3["metrics"]
    assert m3["tasks"]["task_1"] > 0.2 and m3["tasks"]["base"] > m2["tasks"]["base"]
    assert m3["forgetting"]["base"] == pytest.approx(base_acc - m3["tasks"]["base"], abs=1e-6)
    assert m3["backward_transfer"] == pytest.approx(-m3["forgetting"]["base"], abs=1e-6)
    assert m3["average_accuracy"] == pytest.approx((m3["tasks"]["base"] + m3["tasks"]["task_1"]) / 2, abs=1e-6)
    assert {"label_shift", "confidence_shift", "ece", "alerts"} <= set(meta3["drift"])
    assert meta3["labels"]["checked"] == 0  # task 1's classes are new to v0001: nothing to contradict

    # adapter-only update on task 2: the version holds the PEFT adapter, its backbone is v0003's
    code, out, err = ecotrain(capsys, "update", "current", tasks[2], *R, "--tolerance", "1.0",
                              "methods=[{name: adapters, target_modules: [net.0, net.3], r: 4}]", *TRAIN)
    assert code == 0, out + err
    meta4 = reg.read_meta("v0004")
    assert meta4["weights"] == "adapter" and meta4["parent"] == "v0003"
    assert reg.weights("v0004") is None  # no full weights stored: base + adapter
    assert (reg.path("v0004") / "adapter" / "adapter_model.safetensors").is_file()
    assert json.loads((reg.path("v0004") / "adapter" / "adapter_config.json").read_text())["r"] == 4
    assert meta4["metrics"]["tasks"]["task_2"] > 0.2

    # the review queue of the current (adapter) version on task 2
    code, out, _ = ecotrain(capsys, "review-queue", "current", tasks[2], *R, "--top", "5", "--out", root / "q.csv")
    assert code == 0 and "wrote" in out
    lines = (root / "q.csv").read_text().splitlines()
    assert lines[0] == "index,reason,predicted,confidence,label,label_probability" and 6 <= len(lines) <= 11

    # rollback: v0003 current again, v0004 kept as rolled_back
    code, out, _ = ecotrain(capsys, "rollback", *R)
    assert code == 0 and out.strip() == "rolled back: current is v0003 (was v0004)"

    # a bit flipped in a stored version: one line, exit 3, `current` untouched
    f = reg.path("v0002") / "tensors.safetensors"
    data = bytearray(f.read_bytes())
    data[-3] ^= 0x10
    f.write_bytes(bytes(data))
    code, _, err = ecotrain(capsys, "promote", "v0002", *R)
    assert code == 3 and "does not match its checksum" in err and len(err.strip().splitlines()) == 1
    assert reg.index()["current"] == "v0003"

    code, out, _ = ecotrain(capsys, "versions", *R)
    row = {line[2:].split()[0]: line for line in out.splitlines()[1:-1]}
    assert code == 0 and row["v0003"].startswith("* ") and sum(line.startswith("* ") for line in row.values()) == 1
    assert "rolled_back" in row["v0004"] and "rejected" in row["v0002"] and "promoted" in row["v0001"]


def test_a_diverged_update_registers_nothing(world, capsys):
    root, tasks = world
    reg_dir = root / "registry-diverged"
    assert ecotrain(capsys, "versions", "add", root / "base", "--registry", reg_dir)[0] == 0
    before = Registry(reg_dir).index()
    code, out, err = ecotrain(capsys, "update", "current", tasks[1], "--registry", reg_dir, "methods=[]",
                              "loop.max_steps=40", "optim.lr=1e12", "optim.name=sgd")
    assert code != 0 and "training diverged" in err and "nothing was registered" in err, (code, out, err)
    assert Registry(reg_dir).index() == before
