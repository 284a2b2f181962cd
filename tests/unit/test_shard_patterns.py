"""`shards:PATTERN` brace patterns (data/braces.py, data/shards.py `expand`): counted arithmetically
before anything is expanded, so a range of a billion names is one line at once, not a MemoryError
after 37 s; what is within the cap expands as WebDataset's braces do."""

import pytest

from ecotrain.data import braces, shards
from ecotrain.data.shards import MAX_SHARDS, expand
from ecotrain.base.errors import DataError

pytestmark = pytest.mark.unit


def names(pattern):
    parts = [braces.parse(p, pattern) for p in braces.split_top(pattern)]
    out = [n for seq in parts for n in braces.expand(seq)]
    assert sum(braces.count(seq) for seq in parts) == len(out)  # the count is what expansion gives
    return out


@pytest.mark.parametrize("pattern, want", [
    ("a.tar", ["a.tar"]),
    ("t-{0..2}.tar", ["t-0.tar", "t-1.tar", "t-2.tar"]),
    ("t-{008..010}.tar", ["t-008.tar", "t-009.tar", "t-010.tar"]),
    ("t-{2..0}", ["t-2", "t-1", "t-0"]),  # counts down, as webdataset's braceexpand
    ("{a,b}{0..1}", ["a0", "a1", "b0", "b1"]),
    ("{a,b{1..2}}.tar", ["a.tar", "b1.tar", "b2.tar"]),  # nested: the outer choice first, as in bash
    ("x,{y,z}", ["x", "y", "z"]),  # commas outside braces list patterns
    ("{a}", ["a"]),
    ("{,x}y", ["y", "xy"]),
])
def test_braces_expand_and_count_alike(pattern, want):
    assert names(pattern) == want


@pytest.mark.parametrize("pattern, words", [
    ("data/{000000000..999999999}.tar", ["names 1,000,000,000 shards", "over the cap of 1,000,000", "narrower range"]),
    ("{0..9}{0..999}{0..999}", ["names 10,000,000 shards"]),
    ("{a,b,{0..999999}}", ["names 1,000,002 shards"]),
    ("a,{0..999999}", ["names 1,000,001 shards"]),
    ("{0..9.tar", ["braces do not pair up"]),
    ("0..9}.tar", ["braces do not pair up"]),
    ("}{", ["braces do not pair up"]),
    ("{" * 17 + "}" * 17, ["braces nested 17 deep, at most 16"]),
    ("{0..99999999999999999999}", ["a brace range is numbers of up to 18 digits"]),
    ("{a..z}", ["a brace range is numbers"]),
])
def test_a_pattern_too_big_or_malformed_is_one_line_before_any_name_is_built(pattern, words, monkeypatch):
    def built(seq):
        raise AssertionError("expanded before it was counted")

    monkeypatch.setattr(braces, "expand", built)
    with pytest.raises(DataError) as e:
        expand(pattern)
    assert str(e.value).startswith(f"data.name=shards:{pattern}: ")
    for w in words:
        assert w in str(e.value)


def test_the_cap_is_on_what_folders_and_globs_list_too(tmp_path, monkeypatch):
    monkeypatch.setattr(shards, "MAX_SHARDS", 4)
    for i in range(5):
        (tmp_path / f"s-{i}.tar").write_bytes(b"")
    with pytest.raises(DataError, match="more than 4 shards, the cap"):
        expand(str(tmp_path))
    with pytest.raises(DataError, match="more than 4 shards, the cap"):
        expand(f"{tmp_path}/s-*.tar")
    with pytest.raises(DataError, match="names 5 shards, over the cap of 4"):
        expand(f"{tmp_path}/s-{{0..4}}.tar")
    assert len(expand(f"{tmp_path}/s-{{0..3}}.tar")) == 4


def test_a_shard_named_twice_among_thousands_is_found(tmp_path):
    for i in range(2_000):  # the check was list.count per shard, quadratic: minutes at 10,000 shards; now a set
        (tmp_path / f"s-{i:05d}.tar").touch()
    assert len(expand(f"{tmp_path}/s-{{00000..01999}}.tar")) == len(expand(str(tmp_path))) == 2_000
    with pytest.raises(DataError, match="s-00007.tar is named twice"):
        expand(f"{tmp_path}/s-{{00000..01999}}.tar,{tmp_path}/s-00007.tar")
    assert MAX_SHARDS == 1_000_000
