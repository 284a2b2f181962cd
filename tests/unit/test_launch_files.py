"""The cluster launch files a user copies (examples/launch/) are checked, not only written: shell
syntax (`bash -n`), YAML structure, and the ecotrain command inside each parsed by ecotrain's own
CLI parser with its recipe and overrides loaded into a Config. kubectl and sky need not run here."""

import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from ecotrain.cli.program import _parser
from ecotrain.config import load_config

ROOT = Path(__file__).resolve().parents[2]
LAUNCH = ROOT / "examples" / "launch"


def ecotrain_args(words: list[str]) -> list[str]:
    """The arguments after `-m ecotrain` in a torchrun command line."""
    i = words.index("ecotrain")
    assert words[i - 1] == "-m", words
    return words[i + 1:]


def check_ecotrain_command(args: list[str], env: dict[str, str]) -> None:
    args = [env.get(a.strip('"${}'), a) if a.startswith(('"$', "$")) else a for a in args]
    ns = _parser().parse_args(args)
    assert ns.command == "fit" and ns.resume == "auto" and ns.run_dir  # a restart continues the same folder
    cfg = load_config(ROOT / ns.recipe, ns.overrides)  # the recipe exists and every override is valid
    assert cfg.distributed.strategy in ("ddp", "fsdp")


def shell_words(script: str) -> list[str]:
    return shlex.split(script.replace("\\\n", " "), comments=True)


def test_slurm_script_is_valid_bash_requeues_and_resumes():
    path = LAUNCH / "slurm_requeue.sbatch"
    r = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    text = path.read_text()
    assert "#SBATCH --requeue" in text and "scontrol requeue" in text
    assert '"$status" -eq 75' in text  # EXIT_PREEMPTED is what requeues
    from ecotrain.base.errors import EXIT_PREEMPTED
    assert EXIT_PREEMPTED == 75
    words = shell_words(text[text.index("srun "):text.index("wait $!")].rstrip(" &\n"))
    check_ecotrain_command(ecotrain_args(words), {"RECIPE": "recipes/charlm_long.yaml", "RUN_DIR": "/tmp/x"})


def test_pytorchjob_is_an_elastic_job_whose_grace_outlasts_the_checkpoint():
    job = yaml.safe_load((LAUNCH / "pytorchjob.yaml").read_text())
    assert job["apiVersion"] == "kubeflow.org/v1" and job["kind"] == "PyTorchJob"
    elastic = job["spec"]["elasticPolicy"]
    assert elastic["rdzvBackend"] == "c10d" and 1 <= elastic["minReplicas"] <= elastic["maxReplicas"]
    worker = job["spec"]["pytorchReplicaSpecs"]["Worker"]
    assert elastic["minReplicas"] <= worker["replicas"] <= elastic["maxReplicas"]
    pod = worker["template"]["spec"]
    container = pod["containers"][0]
    assert container["command"][-1] == "torch.distributed.run"
    args = ecotrain_args(container["args"])
    check_ecotrain_command(args, {})
    cfg = load_config(ROOT / args[1], _parser().parse_args(args).overrides)
    assert cfg.preemption.grace_seconds < pod["terminationGracePeriodSeconds"]  # saved before the SIGKILL
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert _parser().parse_args(args).run_dir.startswith(mounts["runs"])  # on the volume that survives the pod


def test_skypilot_task_is_a_spot_job_whose_run_script_is_valid_bash():
    task = yaml.safe_load((LAUNCH / "skypilot.yaml").read_text())
    assert task["resources"]["use_spot"] is True and task["num_nodes"] >= 1
    assert task["resources"]["job_recovery"]["strategy"] in ("FAILOVER", "EAGER_NEXT_REGION")
    r = subprocess.run(["bash", "-n"], input=task["run"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    words = shell_words(task["run"].split("\n", 1)[1])
    check_ecotrain_command(ecotrain_args(words), task["envs"])
    assert task["envs"]["RUN_DIR"].startswith(tuple(task["file_mounts"]))  # the run folder is in the bucket


@pytest.mark.parametrize("name", ["slurm_requeue.sbatch", "pytorchjob.yaml", "skypilot.yaml"])
def test_every_launch_file_says_how_to_start_it(name):
    head = (LAUNCH / name).read_text().splitlines()[:3]
    assert any(("sbatch " in line or "kubectl apply" in line or "sky jobs launch" in line) and name in line
               for line in head), head
