"""checkpoint/format.py piece by piece: flatten/unflatten's paths and copies, what write_checkpoint
puts on disk (meta.json, the manifest, the temporary folder), each of verify_checkpoint's refusals
word for word, and load_state_dict_file's layouts."""

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from ecotrain.checkpoint import load_state_dict_file, read_checkpoint, verify_checkpoint, write_checkpoint
from ecotrain.checkpoint.format import FORMAT, _digest, flatten, tensor_refs, unflatten
from ecotrain.base.errors import CheckpointError


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a relative path (a stray "None") never resolves to a file left elsewhere


def _meta(step=3, **extra):
    return {"model": {"w": {"__tensor__": "model/w"}}, "position": {"step": step}, **extra}


def _write(folder, step=3, **extra):
    return write_checkpoint(folder, {"model/w": torch.arange(6.0).view(2, 3)}, _meta(step, **extra))


def _rewrite(folder: Path, name: str, data: bytes, manifest=None):
    """Replace one file and keep the manifest's checksums in step (a consistent but wrong folder)."""
    (folder / name).write_bytes(data)
    m = manifest or json.loads((folder / "MANIFEST.json").read_text())
    if name in m.get("files", {}):
        m["files"][name] = {"xxh3_128": _digest(folder / name), "bytes": len(data)}
    (folder / "MANIFEST.json").write_text(json.dumps(m))


def _refusal(folder) -> str:
    with pytest.raises(CheckpointError) as err:
        verify_checkpoint(folder)
    return str(err.value)


# flatten / unflatten

def test_flatten_names_every_tensor_by_its_path_and_copies_it_to_the_cpu():
    a, b, c, d = (torch.full((2,), float(i), requires_grad=True) for i in range(4))
    t = torch.arange(6.0).view(2, 3).t()  # not contiguous
    obj = {"d": {"a": a}, 5: b, "tup": (1, c), "lst": [None, d, t]}
    tensors = {}
    skel = flatten(obj, tensors)
    assert skel == {"__items__": [["d", {"a": {"__tensor__": "d/a"}}], [5, {"__tensor__": "5"}],
                                  ["tup", {"__tuple__": [1, {"__tensor__": "tup/1"}]}],
                                  ["lst", [None, {"__tensor__": "lst/1"}, {"__tensor__": "lst/2"}]]]}
    assert set(tensors) == {"d/a", "5", "tup/1", "lst/1", "lst/2"}
    assert all(not v.requires_grad for v in tensors.values())  # detached copies by default
    assert tensors["d/a"] is not a and tensors["lst/2"].is_contiguous() and torch.equal(tensors["lst/2"], t)
    back = unflatten(json.loads(json.dumps(skel)), tensors)
    assert back["tup"] == (1, tensors["tup/1"]) and back["lst"][1] is tensors["lst/1"] and back[5] is tensors["5"]
    assert back["d"]["a"] is tensors["d/a"]


def test_flatten_keep_stores_the_tensor_objects_themselves():
    a, b, c, d = (torch.ones(2, requires_grad=True) for _ in range(4))
    tensors = {}
    flatten({"x": a, 1: b, "t": (c,), "l": [d]}, tensors, keep=True)
    assert tensors["x"] is a and tensors["1"] is b and tensors["t/0"] is c and tensors["l/0"] is d
    flatten({"s": {"a": a}}, tensors, keep=True)
    assert tensors["s/a"] is a


def test_flatten_names_what_it_cannot_store():
    with pytest.raises(CheckpointError) as err:
        flatten({"a": [1, {"b": {1, 2}}]}, {})
    assert str(err.value) == "checkpoint: cannot store a set at 'a/1/b' (only tensors and JSON values)"


def test_tensor_refs_reach_into_dicts_and_lists():
    skel = flatten({"a": [torch.ones(1), {"b": torch.ones(1)}], "c": (torch.ones(1),), "e": {}, "f": []}, {})
    assert tensor_refs(skel) == {"a/0", "a/1/b", "c/0"}
    assert tensor_refs([]) == set() and tensor_refs({}) == set() and tensor_refs(3) == set()


# write_checkpoint

def test_the_files_on_disk(tmp_path):
    folder = write_checkpoint(tmp_path / "step-7", {"model/w": torch.ones(2)},
                              {"zeta": 1, "alpha": {"__tensor__": "model/w"}, "position": {"step": 7}})
    assert folder == tmp_path / "step-7"
    assert sorted(p.name for p in folder.iterdir()) == ["MANIFEST.json", "meta.json", "tensors.safetensors"]
    assert (folder / "meta.json").read_text() == '{"alpha": {"__tensor__": "model/w"}, "position": {"step": 7}, "zeta": 1}'
    text = (folder / "MANIFEST.json").read_text()
    manifest = json.loads(text)
    assert text == json.dumps(manifest, indent=2)
    assert manifest["format"] == FORMAT and manifest["step"] == 7
    assert set(manifest["files"]) == {"tensors.safetensors", "meta.json"}
    for name, info in manifest["files"].items():
        assert info == {"xxh3_128": _digest(folder / name), "bytes": (folder / name).stat().st_size}
    assert verify_checkpoint(folder) == manifest
    tensors, meta = read_checkpoint(folder)
    assert torch.equal(tensors["model/w"], torch.ones(2)) and meta["zeta"] == 1
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp")]


def test_a_meta_without_position_has_no_step(tmp_path):
    folder = write_checkpoint(tmp_path / "c", {}, {"a": 1})
    assert json.loads((folder / "MANIFEST.json").read_text())["step"] is None


def test_rewriting_a_checkpoint_replaces_it_whole(tmp_path):
    _write(tmp_path / "c", step=1)
    (tmp_path / "c" / "old.txt").write_text("from the first save")
    write_checkpoint(tmp_path / "c", {"model/w": torch.zeros(1)}, _meta(2))
    assert not (tmp_path / "c" / "old.txt").exists()
    assert read_checkpoint(tmp_path / "c")[1]["position"] == {"step": 2}


def test_a_leftover_temporary_folder_of_this_pid_is_replaced(tmp_path):
    tmp = tmp_path / f".tmp-c-{os.getpid()}"
    tmp.mkdir()
    (tmp / "junk").write_text("x")
    _write(tmp_path / "c")
    assert not tmp.exists() and not (tmp_path / "c" / "junk").exists()
    verify_checkpoint(tmp_path / "c")


def test_a_write_that_fails_says_why_and_leaves_nothing(tmp_path):
    (tmp_path / "afile").write_text("x")
    with pytest.raises(CheckpointError) as err:  # the temporary folder cannot even be made
        _write(tmp_path / "afile" / "step-1")
    assert str(err.value) == (f"could not write checkpoint {tmp_path / 'afile' / 'step-1'}: Not a directory; "
                              "a part of the path is a file, not a folder: choose another path; "
                              "there is no earlier checkpoint")
    staged = tmp_path / "staged"
    (staged / "tensors.safetensors").mkdir(parents=True)  # safetensors' own I/O error
    with pytest.raises(CheckpointError) as err:
        write_checkpoint(tmp_path / "c", {"a": torch.ones(1)}, {}, staged=staged)
    assert str(err.value) == (f"could not write checkpoint {tmp_path / 'c'}: Is a directory (os error 21); "
                              "it is a folder: give a file name; there is no earlier checkpoint")
    assert not staged.exists() and not (tmp_path / "c").exists()


def test_a_staged_folder_with_extra_files_becomes_the_checkpoint(tmp_path):
    staged = tmp_path / ".tmp-c-sharded"
    (staged / "shards").mkdir(parents=True)
    (staged / "shards" / "part.safetensors").write_bytes(b"not checked as safetensors here")
    folder = write_checkpoint(tmp_path / "c", {"model/w": torch.ones(1)},
                              _meta(sharded={"model": {"__tensor__": "model/elsewhere"}}),
                              extra_files=["shards/part.safetensors"], staged=staged)
    assert not staged.exists()
    m = json.loads((folder / "MANIFEST.json").read_text())
    assert m["files"]["shards/part.safetensors"]["bytes"] == len(b"not checked as safetensors here")
    with pytest.raises(CheckpointError, match="shards/part.safetensors: not a readable safetensors file"):
        verify_checkpoint(folder)  # listed (not a stray file), then parsed like every .safetensors
    save_file({"x": torch.ones(1)}, str(tmp_path / "ok.safetensors"))
    _rewrite(folder, "shards/part.safetensors", (tmp_path / "ok.safetensors").read_bytes())
    assert verify_checkpoint(folder)["files"].keys() == {"tensors.safetensors", "meta.json", "shards/part.safetensors"}


# verify_checkpoint: each refusal

def test_no_folder_and_no_checkpoint(tmp_path):
    assert _refusal(tmp_path / "nope") == f"{tmp_path / 'nope'}: no such checkpoint folder"
    (tmp_path / "empty").mkdir()
    assert _refusal(tmp_path / "empty") == (f"{tmp_path / 'empty'}: not a checkpoint folder "
                                            "(no MANIFEST.json, tensors.safetensors or meta.json)")
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "meta.json").write_text("{}")
    assert _refusal(tmp_path / "half") == (f"{tmp_path / 'half'}: incomplete checkpoint (no MANIFEST.json); "
                                           "it was interrupted mid-save")


@pytest.mark.parametrize("name, data, kind", [
    ("notes.txt", b"hello", "an unexpected file"),
    ("w.pt", b"hello", "a pickle file"),
    ("state.pickle", b"", "a pickle file"),
    ("a.json", b"\x80\x02rest", "a pickle file"),
    ("b.json", b"\x80\x05rest", "a pickle file"),
    ("c.json", b"\x80\x06rest", "an unexpected file"),
    ("d.json", b"\x00\x03", "an unexpected file"),
    ("e.json", b"\x80", "an unexpected file"),
    ("f.zip", b"PK\x03\x04", "a pickle file"),
    ("g.zip", b"pk\x03\x04", "an unexpected file"),
])
def test_a_file_outside_the_manifest_is_refused_and_named(tmp_path, name, data, kind):
    folder = _write(tmp_path / "c")
    (folder / name).write_bytes(data)
    assert _refusal(folder) == (f"{folder}: holds {kind} '{name}'; ecotrain checkpoints contain no pickles "
                                "and nothing outside the manifest, so this folder is refused")


def test_a_manifest_that_is_no_json_or_no_object(tmp_path):
    folder = _write(tmp_path / "c")
    (folder / "MANIFEST.json").write_text("{not json")
    assert _refusal(folder) == f"{folder}: MANIFEST.json is not valid JSON"
    (folder / "stray.txt").write_text("x")  # the stray file is still found (the known files assumed)
    assert "holds an unexpected file 'stray.txt'" in _refusal(folder)
    (folder / "stray.txt").unlink()
    (folder / "MANIFEST.json").write_text("[1, 2]")
    assert _refusal(folder) == f"{folder}: format None is not 'ecotrain-checkpoint/1'"


def test_a_manifest_of_another_format(tmp_path):
    folder = _write(tmp_path / "c")
    m = json.loads((folder / "MANIFEST.json").read_text())
    (folder / "MANIFEST.json").write_text(json.dumps({**m, "format": "other/2"}))
    assert _refusal(folder) == f"{folder}: format 'other/2' is not 'ecotrain-checkpoint/1'"


@pytest.mark.parametrize("files", [None, 3, {"tensors.safetensors": "abc", "meta.json": {}}])
def test_a_manifest_without_its_file_list(tmp_path, files):
    folder = _write(tmp_path / "c")
    m = json.loads((folder / "MANIFEST.json").read_text())
    (folder / "MANIFEST.json").write_text(json.dumps({**m, "files": files}))
    assert _refusal(folder) == (f"{folder}: MANIFEST.json does not list tensors.safetensors and meta.json "
                                "with their checksums")


def test_a_manifest_that_leaves_out_meta_json(tmp_path):
    folder = _write(tmp_path / "c")
    m = json.loads((folder / "MANIFEST.json").read_text())
    del m["files"]["meta.json"]
    (folder / "MANIFEST.json").write_text(json.dumps(m))
    assert "holds an unexpected file 'meta.json'" in _refusal(folder)
    (folder / "meta.json").unlink()
    assert _refusal(folder) == (f"{folder}: MANIFEST.json does not list tensors.safetensors and meta.json "
                                "with their checksums")


def test_a_listed_file_that_is_gone_or_changed(tmp_path):
    folder = _write(tmp_path / "c")
    (folder / "meta.json").unlink()
    assert _refusal(folder) == f"{folder}: meta.json is missing"
    folder = _write(tmp_path / "d")
    m = folder / "meta.json"
    m.write_bytes(m.read_bytes().replace(b'"step": 3', b'"step": 4'))  # same size, other bytes
    assert _refusal(folder) == f"{folder}: meta.json does not match its checksum (corrupt or truncated)"
    m.write_bytes(m.read_bytes() + b" ")
    assert _refusal(folder) == f"{folder}: meta.json does not match its checksum (corrupt or truncated)"


def test_a_meta_json_that_is_no_json_or_no_object(tmp_path):
    folder = _write(tmp_path / "c")
    _rewrite(folder, "meta.json", b"{oops")
    assert _refusal(folder) == f"{folder}: meta.json is not valid JSON"
    _rewrite(folder, "meta.json", b"[1]")
    assert _refusal(folder) == f"{folder}: meta.json is not a JSON object"


def test_meta_json_may_refer_to_shards_that_are_not_in_tensors_safetensors(tmp_path):
    folder = _write(tmp_path / "c", sharded={"model": {"w": {"__tensor__": "model/w2"}}})
    verify_checkpoint(folder)
    _rewrite(folder, "meta.json", json.dumps(_meta(other=[{"__tensor__": "b/1"}, {"__tensor__": "a/2"}])).encode())
    assert _refusal(folder) == (f"{folder}: tensors.safetensors lacks 2 tensor(s) that meta.json refers to, "
                                "e.g. 'a/2'; the files do not belong together")


def test_a_safetensors_file_that_does_not_parse_is_named_with_the_reason(tmp_path):
    folder = _write(tmp_path / "c")
    _rewrite(folder, "tensors.safetensors", b"")
    assert _refusal(folder) == (f"{folder}: tensors.safetensors: not a readable safetensors file "
                                "(Error while deserializing header: header too small)")


@pytest.mark.skipif(not Path("/proc/self/mem").exists(), reason="needs Linux's /proc/self/mem")
def test_a_file_that_cannot_be_read_is_a_checkpoint_error(tmp_path):
    folder = _write(tmp_path / "c")
    (folder / "stray").symlink_to("/proc/self/mem")  # a regular file whose first bytes fail to read (EIO)
    assert _refusal(folder) == f"{folder}: cannot be read (Input/output error)"


# load_state_dict_file

def test_plain_weights_from_each_layout(tmp_path):
    w = {"fc.weight": torch.arange(4.0).view(2, 2), "fc.bias": torch.zeros(2)}
    save_file(w, str(tmp_path / "w.safetensors"))
    torch.save({"state_dict": w, "epoch": 3}, tmp_path / "l.ckpt")
    torch.save({"state_dict": 3, "w": torch.ones(1)}, tmp_path / "odd.pt")  # "state_dict" not a dict: left as is
    for name in ("w.safetensors", "l.ckpt"):
        got = load_state_dict_file(tmp_path / name)
        assert got.keys() == w.keys() and all(torch.equal(got[k], w[k]) for k in w), name
    with pytest.raises(CheckpointError) as err:
        load_state_dict_file(tmp_path / "odd.pt")
    assert str(err.value) == f"{tmp_path / 'odd.pt'}: expected a dict of tensors (a model state_dict)"
    torch.save(torch.ones(2), tmp_path / "t.pt")
    with pytest.raises(CheckpointError) as err:
        load_state_dict_file(tmp_path / "t.pt")
    assert str(err.value) == f"{tmp_path / 't.pt'}: expected a dict of tensors (a model state_dict)"


def test_a_missing_or_broken_weights_file(tmp_path):
    with pytest.raises(CheckpointError) as err:
        load_state_dict_file(tmp_path / "gone.safetensors")
    assert str(err.value).startswith(f"weights file: {tmp_path / 'gone.safetensors'} not found; give a .safetensors")
    os.mkfifo(tmp_path / "pipe.pt")  # opening it would block forever: refused before
    with pytest.raises(CheckpointError, match=r"pipe.pt is a FIFO \(named pipe\), not a regular file"):
        load_state_dict_file(tmp_path / "pipe.pt")
    (tmp_path / "e.safetensors").write_bytes(b"\x00")
    with pytest.raises(CheckpointError) as err:
        load_state_dict_file(tmp_path / "e.safetensors")
    assert str(err.value) == (f"{tmp_path / 'e.safetensors'}: not a readable safetensors file "
                              "(Error while deserializing header: header too small)")
    (tmp_path / "e.pt").write_bytes(b"")
    with pytest.raises(CheckpointError) as err:
        load_state_dict_file(tmp_path / "e.pt")
    assert str(err.value) == f"{tmp_path / 'e.pt'}: not a plain state_dict loadable with weights_only=True (EOFError)"
