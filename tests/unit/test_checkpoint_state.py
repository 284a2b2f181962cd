"""checkpoint/snapshot.py and sharded.py on real parts: capture a TrainState, write it, read it back and
restore it into freshly built parts; every piece (RNGs, methods, counters, a stateful loader, the
log windows, each rank's own state, FSDP's shards through DCP) comes back, and what does not match
is named."""

import random

import numpy as np
import pytest
import torch

from ecotrain.callbacks.base import Callback, CallbackList
from ecotrain.checkpoint import CheckpointManager, read_checkpoint
from ecotrain.checkpoint import sharded
from ecotrain.checkpoint.snapshot import capture, environment, load_model_weights, restore, rng_state, set_rng_state
from ecotrain.data.augment import SignalAugment
from ecotrain.core.distributed import Dist
from ecotrain.base.errors import CheckpointError
from ecotrain.methods.base import Method, Methods
from ecotrain.core.precision import Precision
from ecotrain.core.state import TrainState

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


class Tally(Callback):
    def __init__(self, n=0):
        self.n = n

    def state_dict(self):
        return {"n": self.n}

    def load_state_dict(self, sd):
        self.n = sd["n"]


class Other(Tally):
    pass


class Counting(Method):
    key = "counting"

    def __init__(self, n=0):
        self.n = torch.tensor(float(n))

    def state_dict(self):
        return {"n": self.n}

    def load_state_dict(self, sd):
        self.n = sd["n"]


class Loader:
    """A user's stateful loader: its position inside the epoch."""

    def __init__(self, pos=0):
        self.pos = pos

    def state_dict(self):
        return {"pos": self.pos}

    def load_state_dict(self, sd):
        self.pos = None if sd is None else sd["pos"]


class Ranked(Dist):
    """Rank `rank` of `world` processes: the other ranks' gathered state is `others`."""

    def __init__(self, rank, world, others=(), strategy="ddp"):
        self.rank, self.world_size, self.strategy, self.others = rank, world, strategy, list(others)

    def gather_objects(self, obj):
        out = list(self.others)
        out.insert(self.rank, obj)
        return out


def _state(tiny_cfg, seed=0, dist=None, methods=True, loader=True, n=0):
    torch.manual_seed(seed)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    st = TrainState(config=tiny_cfg(), model=model, optimizer=opt, scheduler=sched, objective=None,
                    precision=Precision("fp32", torch.device("cpu")), device=torch.device("cpu"),
                    steps_per_epoch=10, total_steps=100, dist=dist or Dist(),
                    methods=Methods([Counting(n)]) if methods else None, data_source=Loader(n) if loader else None)
    return st


def _train(st, steps=2):
    for _ in range(steps):
        st.model(torch.ones(4, 3)).pow(2).sum().backward()
        st.optimizer.step()
        st.optimizer.zero_grad()
        st.scheduler.step()


def _filled(tiny_cfg, **kw):
    st = _state(tiny_cfg, n=5, **kw)
    _train(st)
    st.step, st.epoch, st.batch_in_epoch, st.samples_seen = 12, 1, 2, 384
    st.window_losses = [torch.tensor(1.5), torch.tensor(2.5)]
    st.window_parts = {"task": [torch.tensor(0.5), torch.tensor(0.25)], "empty": []}
    st.best_metric, st.best_step, st.evals_since_best = 0.75, 10, 1
    st.best_weights = {k: v.detach().clone() + 1 for k, v in st.model.state_dict().items()}
    st.counters.rollbacks, st.counters.oom_recoveries = 2, 1
    st.last_log, st.last_eval = {"loss": 1.0}, {"val_loss": 0.5}
    st.train_seconds = 3.0
    return st


def _augment(seed=0):
    from ecotrain.config import AugmentConfig
    return SignalAugment(AugmentConfig(), seed)


def _roundtrip(tmp_path, st, cbs, augment, **kw):
    tensors, meta, big = capture(st, cbs, augment, 7, "hash-1")
    m = CheckpointManager(tmp_path)
    folder = m.save(st.step, tensors, meta, shards=big, dist=st.dist)
    tensors, meta = read_checkpoint(folder)
    return folder, tensors, meta


def _equal_sd(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_rng_state_round_trip_draws_the_same_numbers():
    random.seed(1)
    np.random.seed(2)
    np.random.standard_normal(1)  # an odd number of Gaussian draws: NumPy holds the second one back
    torch.manual_seed(3)
    s = rng_state()
    np_state = np.random.get_state()
    assert s["numpy"]["keys"].dtype == torch.int64
    assert (s["numpy"]["pos"], s["numpy"]["has_gauss"], s["numpy"]["gauss"]) == (
        np_state[2], np_state[3], np_state[4]) and np_state[3] == 1
    assert s["cuda"] == ([] if not torch.cuda.is_available() else s["cuda"])
    first = (random.random(), np.random.standard_normal(3).tolist(), np.random.randint(0, 10**6), torch.rand(3))
    set_rng_state(s)
    again = (random.random(), np.random.standard_normal(3).tolist(), np.random.randint(0, 10**6), torch.rand(3))
    assert first[:3] == again[:3] and torch.equal(first[3], again[3])


def test_environment_names_what_breaks_bit_exactness(tiny_cfg):
    st = _state(tiny_cfg, dist=Ranked(0, 3, others=[None, None]))
    assert environment(st) == {"torch": torch.__version__, "device": "cpu", "deterministic": True,
                               "threads": torch.get_num_threads(), "world_size": 3}


def test_capture_and_restore_bring_back_the_whole_state(tiny_cfg, tmp_path, ecotrain_log):
    st, cbs, augment = _filled(tiny_cfg), CallbackList([Tally(4)]), _augment()
    augment.gen.manual_seed(99)
    folder, tensors, meta = _roundtrip(tmp_path, st, cbs, augment)
    assert meta["ranks"] is None and meta["metrics_offset"] == 7 and meta["dataset_hash"] == "hash-1"
    assert meta["methods"] == {"counting": {"n": {"__tensor__": "methods/counting/n"}}}
    assert meta["counters"]["rollbacks"] == 2 and meta["data"] == {"pos": 5}
    assert meta["env"] == environment(st) and meta["callbacks"] == {"Tally": {"n": 4}}
    assert torch.equal(tensors["window_losses"], torch.tensor([1.5, 2.5]))
    assert torch.equal(tensors["window_parts/task"], torch.tensor([0.5, 0.25])) and "window_parts/empty" not in tensors
    expected_draw = torch.rand(4)
    torch.manual_seed(1234)  # restore must set the RNG back, not leave it here

    fresh, cbs2, augment2 = _state(tiny_cfg, seed=1), CallbackList([Tally()]), _augment(5)
    whole = restore(fresh, cbs2, augment2, tensors, meta, folder)
    _equal_sd(fresh.model.state_dict(), st.model.state_dict())
    assert fresh.optimizer.state_dict()["state"][0]["exp_avg"].equal(st.optimizer.state_dict()["state"][0]["exp_avg"])
    assert fresh.scheduler.get_last_lr() == st.scheduler.get_last_lr() == [0.025]
    assert (fresh.step, fresh.epoch, fresh.batch_in_epoch, fresh.samples_seen) == (12, 1, 2, 384)
    assert (fresh.best_metric, fresh.best_step, fresh.evals_since_best) == (0.75, 10, 1)
    _equal_sd(fresh.best_weights, st.best_weights)
    assert fresh.methods.methods[0].n.item() == 5.0 and fresh.data_source.pos == 5 and cbs2.callbacks[0].n == 4
    assert fresh.counters.rollbacks == 2 and fresh.counters.oom_recoveries == 1
    assert [t.item() for t in fresh.window_losses] == [1.5, 2.5]
    assert {k: [t.item() for t in v] for k, v in fresh.window_parts.items()} == {"task": [0.5, 0.25]}
    assert fresh.last_log == {"loss": 1.0} and fresh.last_eval == {"val_loss": 0.5} and fresh.train_seconds == 3.0
    assert fresh.last_checkpoint == str(folder)
    assert torch.equal(augment2.gen.get_state(), augment.gen.get_state())
    assert torch.equal(torch.rand(4), expected_draw)
    assert whole["position"]["step"] == 12 and "sharded" not in meta
    assert "start afresh" not in ecotrain_log.text


def test_capture_copies_unless_told_not_to(tiny_cfg):
    st = _filled(tiny_cfg)
    tensors, _, big = capture(st, CallbackList([]), _augment(), 0, "h")
    shared, _, _ = capture(st, CallbackList([]), _augment(), 0, "h", copy=False)
    assert big is None
    with torch.no_grad():
        st.model.weight.add_(10.0)
    assert not torch.equal(tensors["model/weight"], st.model.weight)
    assert torch.equal(shared["model/weight"], st.model.weight)


def test_a_state_without_methods_loader_or_window(tiny_cfg, tmp_path):
    st = _state(tiny_cfg, methods=False, loader=False)
    folder, tensors, meta = _roundtrip(tmp_path, st, CallbackList([]), _augment())
    assert meta["methods"] == {} and meta["data"] is None and meta["window_losses"] is None
    assert meta["window_parts"] == {}
    fresh = _state(tiny_cfg, seed=1, methods=False, loader=False)
    fresh.window_losses, fresh.window_parts = [torch.tensor(9.0)], {"x": [torch.tensor(1.0)]}
    restore(fresh, CallbackList([]), _augment(), tensors, meta, folder)
    assert fresh.window_losses == [] and fresh.window_parts == {}
    _equal_sd(fresh.model.state_dict(), st.model.state_dict())


def test_a_state_from_before_methods_counters_and_data_were_saved(tiny_cfg, tmp_path):
    st = _filled(tiny_cfg, methods=False, loader=False)
    folder, tensors, meta = _roundtrip(tmp_path, st, CallbackList([]), _augment())
    for key in ("methods", "counters", "data", "window_parts"):
        meta.pop(key)
    fresh = _state(tiny_cfg, seed=1, methods=False)
    fresh.data_source.pos = 3
    restore(fresh, CallbackList([]), _augment(), tensors, meta, folder)
    assert fresh.data_source.pos is None and fresh.counters.rollbacks == 0 and fresh.window_parts == {}


def test_each_rank_restores_its_own_rng_augmentation_and_window(tiny_cfg, tmp_path):
    other_gen = torch.Generator().manual_seed(42)
    other = {"rng": rng_state(), "augment": {"gen": other_gen.get_state()}, "window": torch.tensor([7.0]),
             "window_parts": {"task": torch.tensor([0.125])}}
    torch.manual_seed(5)
    st = _filled(tiny_cfg, dist=Ranked(1, 2, others=[other]))
    aug = _augment(3)
    folder, tensors, meta = _roundtrip(tmp_path, st, CallbackList([]), aug)
    assert meta["ranks"] is not None and len(meta["ranks"]) == 2
    mine_draw = torch.rand(2)

    for rank, window, part, gen in ((1, [1.5, 2.5], [0.5, 0.25], aug.gen), (0, [7.0], [0.125], other_gen),
                                    (2, [7.0], [0.125], other_gen)):  # a rank the checkpoint lacks: rank 0's
        fresh, a = _state(tiny_cfg, seed=1, dist=Ranked(rank, 3)), _augment(8)
        restore(fresh, CallbackList([]), a, tensors, dict(meta), folder)
        assert [t.item() for t in fresh.window_losses] == window, rank
        assert [t.item() for t in fresh.window_parts["task"]] == part, rank
        assert torch.equal(a.gen.get_state(), gen.get_state()), rank
        if rank == 1:
            assert torch.equal(torch.rand(2), mine_draw)


def test_callbacks_and_methods_without_saved_state(tiny_cfg, tmp_path, ecotrain_log):
    st = _filled(tiny_cfg)
    folder, tensors, meta = _roundtrip(tmp_path, st, CallbackList([]), _augment())
    fresh = _state(tiny_cfg, seed=1)
    with pytest.raises(CheckpointError, match=rf"^{folder}: the checkpoint holds no state for callback 'Tally'"):
        restore(fresh, CallbackList([Tally()]), _augment(), tensors, dict(meta), folder)
    restore(fresh, CallbackList([Tally(), Other()]), _augment(), tensors, dict(meta), folder, allow_missing=True)
    assert "callbacks without saved state start afresh: Tally, Other" in ecotrain_log.text
    meta["methods"] = {}
    with pytest.raises(CheckpointError, match=rf"^{folder}: the checkpoint holds no state for method 'counting'"):
        restore(_state(tiny_cfg), CallbackList([]), _augment(), tensors, dict(meta), folder)
    del meta["methods"]  # a checkpoint from before methods were saved
    with pytest.raises(CheckpointError, match=r"holds no state for method 'counting' \(saved methods: none\)"):
        restore(_state(tiny_cfg), CallbackList([]), _augment(), tensors, dict(meta), folder)


def test_restoring_into_another_model_names_the_checkpoint(tiny_cfg, tmp_path):
    st = _filled(tiny_cfg)
    folder, tensors, meta = _roundtrip(tmp_path, st, CallbackList([]), _augment())
    other = _state(tiny_cfg)
    other.model = torch.nn.Linear(3, 5)
    with pytest.raises(CheckpointError, match=rf"^{folder}: weights are for a different model: shape mismatch"):
        restore(other, CallbackList([]), _augment(), tensors, meta, folder)


def test_load_model_weights_names_the_first_five_differences(tmp_path):
    model = torch.nn.Sequential(*[torch.nn.Linear(2, 2) for _ in range(4)])  # 8 tensors
    with pytest.raises(CheckpointError) as err:
        load_model_weights(model, {"a": torch.ones(1)}, tmp_path / "c")
    assert str(err.value) == (f"{tmp_path / 'c'}: weights are for a different model: missing keys "
                              "['0.bias', '0.weight', '1.bias', '1.weight', '2.bias'], unexpected keys ['a'] "
                              "(model has 8 tensors, file 1)")
    saved = {f"{k}": torch.zeros(3, 3) for k in model.state_dict()} | {f"z{i}": torch.ones(1) for i in range(7)}
    with pytest.raises(CheckpointError, match=r"unexpected keys \['z0', 'z1', 'z2', 'z3', 'z4'\] \(model has 8"):
        load_model_weights(model, saved, "w")
    wrong = {k: torch.zeros(3, 3) for k in model.state_dict()}
    with pytest.raises(CheckpointError) as err:
        load_model_weights(model, wrong, "w")
    assert str(err.value) == ("w: weights are for a different model: shape mismatch in "
                              "['0.weight: (3, 3) in file vs (2, 2) in model', '0.bias: (3, 3) in file vs (2,) in model', "
                              "'1.weight: (3, 3) in file vs (2, 2) in model', '1.bias: (3, 3) in file vs (2,) in model', "
                              "'2.weight: (3, 3) in file vs (2, 2) in model']")
    good = {k: torch.full_like(v, 0.5) for k, v in model.state_dict().items()}
    load_model_weights(model, good, "w")
    assert all(torch.equal(v, good[k]) for k, v in model.state_dict().items())


def test_sharded_state_is_split_out_written_by_dcp_and_loaded_back(tiny_cfg, tmp_path):
    st = _filled(tiny_cfg, dist=Ranked(0, 1, strategy="fsdp"))
    tensors, meta, big = capture(st, CallbackList([]), _augment(), 0, "h")
    assert "model" not in meta and "optimizer" not in meta and "weights" not in meta["best"]
    assert set(meta["sharded"]) == {"model", "optimizer", "best_weights"}
    assert {"model/weight", "model/bias", "best_weights/weight", "optimizer/state/weight/exp_avg"} <= set(big)
    assert not any(k.startswith(("model/", "optimizer/")) for k in tensors)
    with torch.no_grad():
        before = st.model.weight.detach().clone()
        st.model.weight.add_(10.0)  # the captured shards are copies
    assert torch.equal(big["model/weight"], before) and torch.equal(big["best_weights/weight"], before + 1)
    with torch.no_grad():
        st.model.weight.copy_(before)

    folder = CheckpointManager(tmp_path).save(12, tensors, meta, shards=big, dist=st.dist)
    tensors, meta = read_checkpoint(folder)
    fresh = _state(tiny_cfg, seed=1, dist=Ranked(0, 1, strategy="fsdp"))
    whole = restore(fresh, CallbackList([]), _augment(), tensors, meta, folder)
    _equal_sd(fresh.model.state_dict(), st.model.state_dict())
    _equal_sd(fresh.best_weights, st.best_weights)
    assert whole["best"]["weights"] is fresh.best_weights
    assert torch.equal(fresh.optimizer.state_dict()["state"][0]["exp_avg"], st.optimizer.state_dict()["state"][0]["exp_avg"])
    assert fresh.step == 12


def test_sharded_load_without_best_weights(tiny_cfg, tmp_path):
    st = _state(tiny_cfg, dist=Ranked(0, 1, strategy="fsdp"))
    _train(st)
    tensors, meta, big = capture(st, CallbackList([]), _augment(), 0, "h")
    assert meta["sharded"]["best_weights"] is None and not any(k.startswith("best_weights") for k in big)
    folder = CheckpointManager(tmp_path).save(3, tensors, meta, shards=big, dist=st.dist)
    fresh = _state(tiny_cfg, seed=1)
    got = sharded.load_into(folder, fresh.model, fresh.optimizer, read_checkpoint(folder)[1]["sharded"])
    assert got["best_weights"] is None
    _equal_sd(fresh.model.state_dict(), st.model.state_dict())
    _equal_sd(got["model"], st.model.state_dict())
