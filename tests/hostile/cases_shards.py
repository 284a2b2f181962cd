"""The hostile corpus, sharded streams (`data.name: shards:PATTERN`, data/tarheaders.py, data/braces.py):
tar headers a broken or hostile writer makes (a negative or huge size, a bad checksum, member names
that are absolute, climb out with `..`, hold a NUL or are empty, pax records that do not parse), a
sample with two members of one extension, and brace patterns too big or malformed to expand. Each is
one line naming the shard file and the member (or the pattern), before any training. The harness is
in cases.py; a low `ulimit -n` over thousands of shards is tests/unit/test_shard_descriptors.py."""

from __future__ import annotations

from tests.hostile.cases import FIT, NO_RUN, RUN, Case, both, tars, write
from tests.helpers.tars import member, npy_bytes, raw_tar

CASES: list[Case] = []

SHARDS = ["data.name=shards:{tmp}/s", "data.features=[npy]"]
GOOD = tars("s/a.tar")  # 60 whole samples; each case's damage is in s/b.tar
SAMPLE = (member("000000.npy", npy_bytes([1.0, 2.0, 3.0, 4.0])), member("000000.cls", b"1"))
X = npy_bytes([0.5, 0.5, 0.5, 0.5])


def bad(*members: bytes):
    """s/a.tar whole, and s/b.tar: one good sample, then `members`."""
    return both(GOOD, write("s/b.tar", raw_tar(*SAMPLE, *members)))


def refused(id: str, words, setup, *extra: str, isolated: bool = False) -> Case:
    return Case(id, [*FIT, *SHARDS, *extra, *RUN], 2, ["b.tar", *words], setup, absent=NO_RUN, isolated=isolated)


CASES += [
    # a negative size moved tarfile's reader backwards: the index looped forever (isolated: a regression
    # times out in its own process instead of hanging the corpus)
    refused("shards_tar_negative_size", ["corrupt tar header at byte 2048", "'000001.npy'", "negative size (-512)"],
            bad(member("000001.npy", X, size=-512)), isolated=True),
    refused("shards_tar_negative_size_in_a_pax_record", ["'000001.npy'", "negative size (-1024)"],
            bad(member("././@PaxHeader", b"14 size=-1024\n", kind=b"x"), member("000001.npy", X)), isolated=True),
    refused("shards_tar_size_past_the_end", ["truncated", "'000001.npy'", "needs 1000000000000000000 bytes"],
            bad(member("000001.npy", X, size=10 ** 18))),
    refused("shards_tar_huge_pax_header", ["'././@PaxHeader'", "needs 1099511627776 bytes"],
            bad(member("././@PaxHeader", b"19 path=000001.npy\n", size=1 << 40, kind=b"x"))),
    refused("shards_tar_pax_record_does_not_parse", ["corrupt tar header at byte 2048", "pax record"],
            bad(member("././@PaxHeader", b"garbage here\n", kind=b"x"), member("000001.npy", X))),
    refused("shards_tar_bad_checksum", ["corrupt tar header at byte 2048", "on_bad_shard=skip"],
            bad(bytes([0xFF]) * 20 + member("000001.npy", X)[20:])),
    refused("shards_tar_absolute_member_name", ["'/etc/000001.npy'", "at byte 2048", "absolute name"],
            bad(member("/etc/000001.npy", X))),
    refused("shards_tar_member_name_climbs_out", ["'../000001.npy'", "'..' in its name"],
            bad(member("../000001.npy", X))),
    refused("shards_tar_nul_in_member_name", ["at byte 2048", "000001\\x00x.npy", "NUL byte"],
            bad(member(b"000001\0x.npy", X))),
    refused("shards_tar_empty_member_name", ["member '' at byte 2048", "empty name"], bad(member(b"", X))),
    refused("shards_tar_sparse_member", ["'000001.npy'", "sparse file"], bad(member("000001.npy", X, kind=b"S"))),
    # two members of one extension: the first was silently replaced by the second
    refused("shards_tar_two_members_of_one_extension", ["sample '000001'", "two '.npy' members", "at byte 3072"],
            bad(member("000001.npy", X), member("000001.npy", X), member("000001.cls", b"0"))),
]

# skip: the damaged shard's whole samples are kept, the run finishes and says what it left out
CASES += [
    Case("shards_tar_negative_size_skipped", [*FIT, *SHARDS, "data.on_bad_shard=skip", *RUN], 0,
         ["b.tar", "negative size (-512)", "skipped"], bad(member("000001.npy", X, size=-512)), isolated=True),
    Case("shards_tar_two_members_of_one_extension_skipped", [*FIT, *SHARDS, "data.on_bad_shard=skip", *RUN], 0,
         ["b.tar", "sample '000001' has two '.npy' members", "skipped"],
         bad(member("000001.npy", X), member("000001.npy", X), member("000001.cls", b"0"))),
]

# patterns: counted before anything is expanded (a billion names took 37 s to a MemoryError)
PATTERN = ["data.name=shards:{tmp}/s/{000000000..999999999}.tar"]
CASES += [
    Case("shards_brace_range_of_a_billion", [*FIT, *PATTERN, *RUN], 2,
         ["1,000,000,000 shards", "over the cap of 1,000,000", "narrower range"], GOOD, absent=NO_RUN),
    Case("shards_brace_ranges_multiplied_past_the_cap", [*FIT, "data.name=shards:{tmp}/s/{0..9}{0..999}{0..999}.tar",
                                                         *RUN], 2, ["10,000,000 shards", "cap of 1,000,000"], GOOD,
         absent=NO_RUN),
    Case("shards_braces_unpaired", [*FIT, "data.name=shards:{tmp}/s/{0..9.tar", *RUN], 2,
         ["{0..9.tar", "braces do not pair up"], GOOD, absent=NO_RUN),
    Case("shards_brace_range_of_huge_numbers", [*FIT, "data.name=shards:{tmp}/s/{0..99999999999999999999999}.tar",
                                                *RUN], 2, ["a brace range is numbers of up to 18 digits"], GOOD,
         absent=NO_RUN),
    Case("shards_braces_nested_deep", [*FIT, "data.name=shards:{tmp}/s/" + "{a," * 40 + "b" + "}" * 40, *RUN], 2,
         ["braces nested 40 deep", "at most 16"], GOOD, absent=NO_RUN),
]
