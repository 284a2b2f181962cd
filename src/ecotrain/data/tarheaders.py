"""The headers of a tar shard, read and checked one 512-byte block at a time.

tarfile trusts a header's size: a negative one moves its reader backwards, so indexing never ends,
and it reads a pax or long-name entry of any declared size into memory. This reader checks each
header before it moves on (checksum, size, name), so every step goes forward by at least one
block and no input can hang it or make it allocate more than the caps below. It reads what
tarfile writes and what `tar` and webdataset's TarWriter write: ustar, GNU (long names, base-256
sizes) and pax headers; links, folders and other special members are passed over.
"""

from __future__ import annotations

from typing import BinaryIO, Iterator

BLOCK = 512
REGULAR = (b"0", b"\0", b"7")  # a file, an old-style file, a contiguous file
NO_DATA = (b"1", b"2", b"3", b"4", b"5", b"6")  # links, devices, folders, fifos: their size is not data
MAX_META = 1 << 20  # a pax header or GNU long name longer than this is damage, not a name


class TarDamage(Exception):
    """What is wrong, where; `cut`: the member named `name` is cut short by the end of the file."""

    def __init__(self, what: str, at: int, cut: bool = False, name: str = ""):
        super().__init__(what)
        self.what, self.at, self.cut, self.name = what, at, cut, name


def _number(field: bytes, what: str, name: str, at: int) -> int:
    """An octal or GNU base-256 number field; damage when it is neither."""
    if field[:1] in (b"\x80", b"\xff"):
        n = int.from_bytes(field[1:], "big")
        return n - (1 << (8 * (len(field) - 1))) if field[:1] == b"\xff" else n
    text = field.split(b"\0", 1)[0].strip(b" ")
    digits = text[1:] if text[:1] == b"-" else text
    if not text or digits and all(c in b"01234567" for c in digits):
        return int(text or b"0", 8)
    raise TarDamage(f"corrupt tar header at byte {at}: the {what} field{_of(name)} is not a number ({field!r})", at)


def _decimal(value: str, name: str, at: int) -> int:
    """A pax header's size: decimal digits."""
    digits = value[1:] if value.startswith("-") else value
    if not (digits.isascii() and digits.isdigit()):
        raise TarDamage(f"corrupt tar header at byte {at}: the pax size{_of(name)} is not a number ({value!r})", at)
    return int(value)


def _of(name: str | None) -> str:
    return f" of member {name!r}" if name else ""


def _text(field: bytes, what: str, at: int) -> str:
    """A NUL-padded name field; a NUL followed by more name is refused."""
    head, _, tail = field.partition(b"\0")
    if tail.strip(b"\0"):
        shown = field.rstrip(b"\0")
        raise TarDamage(f"corrupt tar header at byte {at}: the {what} {shown!r} holds a NUL byte", at)
    return head.decode("utf-8", "surrogateescape")


def _checked_name(name: str, at: int) -> str:
    """Member names must be relative paths with a key: what each sample is known by."""
    problem = ("an empty name" if not name else
               "a NUL byte in its name" if "\0" in name else
               "an absolute name" if name.startswith("/") else
               "'..' in its name" if ".." in name.split("/") else None)
    if problem:
        raise TarDamage(f"member {name!r} at byte {at} has {problem}; members are named by relative paths, "
                        "KEY.EXT (e.g. 000042.npy)", at)
    return name


def _pax(raw: bytes, at: int) -> dict[str, str]:
    """`LEN key=value\\n` records; damage on any record that does not parse."""
    out, pos, end = {}, 0, len(raw.rstrip(b"\0"))
    while pos < end:
        sp = raw.find(b" ", pos)
        try:
            n = int(raw[pos:sp]) if sp > pos else -1
        except ValueError:
            n = -1
        rec = raw[pos:pos + n] if sp - pos + 1 < n <= len(raw) - pos else b""  # within the header's data
        if not rec.endswith(b"\n") or b"=" not in rec[sp - pos:]:
            raise TarDamage(f"corrupt tar header at byte {at}: a pax record at byte {at + BLOCK + pos} "
                            "does not parse", at)
        key, _, value = rec[sp - pos + 1:-1].partition(b"=")
        out[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        pos += n
    return out


def members(f: BinaryIO, size: int) -> Iterator[tuple[str, int, int, int]]:
    """(name, header offset, data offset, data size) of each regular member, in file order (the header
    offset is its first header's, a pax or long-name one when it has them, as tarfile says). Raises
    TarDamage for the first thing wrong; a file that ends cleanly after a member, without the two
    zero blocks, is whole (as `tar` reads it)."""
    pos, long_name, pax, first = 0, None, {}, None
    while True:
        if pos >= size:
            if pos > size:
                raise TarDamage(f"truncated at byte {size} (the padding after the last member is cut)", size)
            return
        f.seek(pos)
        block = f.read(BLOCK)
        if len(block) < BLOCK:
            raise TarDamage(f"truncated at byte {size} (a header is cut)" if pos else
                            "not a readable tar shard (shorter than one 512-byte header)", pos)
        if not block.strip(b"\0"):
            return  # the end-of-archive blocks
        if not _summed(block, pos):
            raise TarDamage(f"corrupt tar header at byte {pos}" if pos else
                            "not a readable tar shard (no tar header at byte 0: its checksum does not match)", pos)
        kind = block[156:157]
        at = pos if first is None else first  # where the member starts: its first (pax, long-name) header
        name = _text(block[:100], "name", at)
        if block[257:263] == b"ustar\0" and block[345:346] != b"\0":  # POSIX ustar: a prefix for long paths
            name = _text(block[345:500], "name prefix", at) + "/" + name
        name = pax.get("path", long_name if long_name is not None else name)
        n = _number(block[124:136], "size", name, at)
        if "size" in pax and kind not in (b"x", b"g"):
            n = _decimal(pax["size"], name, at)
        if n < 0:
            raise TarDamage(f"corrupt tar header at byte {at}: member {name!r} declares a negative size ({n})", at)
        data = pos + BLOCK
        if kind in NO_DATA:
            n = 0  # as tarfile and tar read them: nothing follows a link's or a folder's header
        if data + n > size:
            raise TarDamage(f"truncated: member {name!r} at byte {at} needs {n} bytes, the file ends first", at,
                            cut=True, name=name)
        nxt = data + -(-n // BLOCK) * BLOCK
        if kind in (b"L", b"K", b"x", b"g"):
            if n > MAX_META:
                raise TarDamage(f"corrupt tar header at byte {pos}: a {n}-byte {'pax' if kind in b'xg' else 'long'}"
                                f" header (at most {MAX_META})", pos)
            f.seek(data)
            raw = f.read(n)
            if kind == b"L":
                long_name = _text(raw, "long name", pos)
            elif kind == b"x":
                pax = _pax(raw, pos)
                if any(k.startswith("GNU.sparse.") for k in pax):
                    raise TarDamage(f"member at byte {pos} is a sparse file; write the shard without sparse "
                                    "members (tar without --sparse)", pos)
            first = pos if first is None else first
            pos = nxt
            continue
        if kind == b"S":
            raise TarDamage(f"member {name!r} at byte {at} is a sparse file; write the shard without sparse "
                            "members (tar without --sparse)", at)
        if kind in REGULAR and not name.endswith("/"):
            yield _checked_name(name, at), at, data, n
        pos, long_name, pax, first = nxt, None, {}, None


def _summed(block: bytes, at: int) -> bool:
    """The header's checksum holds: its bytes summed with the checksum field read as spaces, unsigned
    or (old writers) signed, as tar accepts."""
    try:
        stored = _number(block[148:156], "checksum", "", at)
    except TarDamage:
        return False
    head = block[:148] + block[156:]
    return stored == 256 + sum(head) or stored == 256 + sum(b - 256 if b > 127 else b for b in head)
