"""MLflow and TensorBoard for real: a tiny run with both trackers on, resumed from a mid-run
checkpoint, read back with MLflow's own client (sqlite store) and TensorBoard's EventAccumulator;
the champion alias in MLflow's model registry."""

import json

import pytest

CFG = {"name": "tracked", "data": {"name": "digits", "batch_size": 32, "val_split": 0.15},
       "model": {"name": "mlp", "kwargs": {"hidden": [32]}}, "optim": {"lr": 3e-3},
       "loop": {"max_steps": 60, "max_epochs": None, "log_every": 10, "eval_every": 20},
       "checkpoint": {"every_n_steps": 20, "keep_last": 3}, "logging": {"progress": "off"},
       "ledger": {"energy": "off"}}


@pytest.fixture(scope="module")
def tracked(tmp_path_factory):
    from ecotrain import Config, fit

    root = tmp_path_factory.mktemp("trackers")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    cfg = Config.model_validate({**CFG, "tracking": {"mlflow": {"tracking_uri": uri, "experiment": "tests"},
                                                     "tensorboard": {}}})
    run = root / "run"
    fit(cfg, run_dir=run)
    first = json.loads((run / "mlflow.json").read_text())
    fit(cfg, run_dir=run, resume=run / "checkpoints" / "step-00000040")  # steps 41..60 again
    return {"run": run, "uri": uri, "first": first, "info": json.loads((run / "mlflow.json").read_text()),
            "summary": json.loads((run / "summary.json").read_text()),
            "records": [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]}


def test_mlflow_holds_params_metrics_ledger_artifacts_and_tags(tracked):
    from mlflow.tracking import MlflowClient

    info, s = tracked["info"], tracked["summary"]
    assert info["run_id"] == tracked["first"]["run_id"]  # the resume continued the same MLflow run
    client = MlflowClient(tracking_uri=tracked["uri"])
    run = client.get_run(info["run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.params["optim.lr"] == "0.003" and run.data.params["model.name"] == "mlp"
    tags = run.data.tags
    assert tags["ecotrain.dataset_hash"] == s["dataset_hash"] and tags["ecotrain.stopped_because"] == "max_steps"
    env = json.loads((tracked["run"] / "environment.json").read_text())
    if env.get("git", {}).get("commit"):
        assert tags["mlflow.source.git.commit"] == env["git"]["commit"]
    m = run.data.metrics
    assert m["final.test_accuracy"] == pytest.approx(s["test_accuracy"]) and m["ledger.flops"] > 0
    evals = [r for r in tracked["records"] if "val_loss" in r]
    history = {h.step: h.value for h in client.get_metric_history(info["run_id"], "val_loss")}
    assert sorted(history) == [20, 40, 60]
    assert history[60] == pytest.approx(evals[-1]["val_loss"])
    losses = client.get_metric_history(info["run_id"], "loss")
    assert {h.step for h in losses} == {10, 20, 30, 40, 50, 60}
    artifacts = {a.path for a in client.list_artifacts(info["run_id"])}
    assert {"config.yaml", "metrics.jsonl", "summary.json", "ledger.json", "environment.json",
            "model.safetensors"} <= artifacts
    assert "checkpoints" not in artifacts  # only with tracking.mlflow.checkpoints: true


def test_tensorboard_events_read_back_without_the_killed_segment_twice(tracked):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tracked["run"] / "tensorboard"))
    acc.Reload()
    scalars = set(acc.Tags()["scalars"])
    assert {"train/loss", "train/lr", "val/loss", "val/accuracy", "cost/flops", "final/test_accuracy"} <= scalars
    val = acc.Scalars("val/loss")
    assert [e.step for e in val] == [20, 40, 60]  # purge_step on resume: steps after 40 once, not twice
    evals = [r for r in tracked["records"] if "val_loss" in r]
    assert [e.value for e in val] == pytest.approx([r["val_loss"] for r in evals], rel=1e-6)
    assert acc.Scalars("final/test_accuracy")[-1].value == pytest.approx(tracked["summary"]["test_accuracy"])
    assert "config/text_summary" in acc.Tags()["tensors"]  # add_text


def test_register_champion_moves_the_alias(tracked):
    from mlflow.tracking import MlflowClient

    from ecotrain.tracking.mlflow_tracker import register_champion

    v1 = register_champion(tracked["run"], "digits-mlp")
    v2 = register_champion(tracked["run"], "digits-mlp")
    assert (v1, v2) == (1, 2)
    client = MlflowClient(tracking_uri=tracked["uri"], registry_uri=tracked["uri"])
    champion = client.get_model_version_by_alias("digits-mlp", "champion")
    assert int(champion.version) == 2 and champion.run_id == tracked["info"]["run_id"]
    assert champion.source.endswith("/model.safetensors")
