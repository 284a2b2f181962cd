"""Transcripts: the word vocabulary, normalisation of what users type, and injected bad labels.

Users write the same answer many ways ("7", "Seven.", "SEVEN, 3"): `normalize_transcript` maps
them to one token sequence or says the text is not a digit transcript (None). `corrupt` makes the
feedback's bad labels on purpose: formatting noise (fixed by normalisation) and wrong transcripts
(the label checks must catch them).
"""

from __future__ import annotations

import random
import re
from typing import Optional

WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
VOCAB = ["<blank>"] + WORDS  # CTC blank is id 0; word w is id WORDS.index(w) + 1
_ALIASES = {"oh": "zero", "nought": "zero", "naught": "zero", "won": "one", "to": "two", "too": "two",
            "for": "four", "ate": "eight"}
_SPLIT = re.compile(r"[\s,.;:!?\-_/]+")


def normalize_transcript(text: str) -> Optional[list[str]]:
    """Digit words, lower case, no punctuation; a run of digits ("73") is one word per digit.
    None when any part is not a digit or a digit word."""
    if not isinstance(text, str):
        return None
    out: list[str] = []
    for part in _SPLIT.split(text.strip().lower()):
        if not part:
            continue
        if part.isdigit() and part.isascii():
            out += [WORDS[int(c)] for c in part]
        elif part in WORDS:
            out.append(part)
        elif part in _ALIASES:
            out.append(_ALIASES[part])
        else:
            return None
    return out or None


def encode(words: list[str]) -> list[int]:
    return [WORDS.index(w) + 1 for w in words]


def decode(ids: list[int]) -> str:
    return " ".join(VOCAB[i] for i in ids if i > 0)


def reformat(words: list[str], rng: random.Random) -> str:
    """The same words as a user might type them: digits, stray case, punctuation."""
    style = rng.randrange(3)
    if style == 0:
        return "".join(str(WORDS.index(w)) for w in words)  # "739"
    if style == 1:
        return ", ".join(w.upper() if rng.random() < 0.5 else w.capitalize() for w in words) + "."
    return " ".join(str(WORDS.index(w)) if rng.random() < 0.5 else w for w in words) + rng.choice(["!", "?", ""])


def corrupt(words: list[str], rng: random.Random, wrong: float, formatting: float) -> tuple[str, str]:
    """(the transcript a user sent, kind): 'wrong' (another digit sequence, as when feedback is
    attached to the wrong clip or mistyped), 'format' (right words, inconsistent form), or 'clean'."""
    r = rng.random()
    if r < wrong:
        while True:
            other = [rng.choice(WORDS) for _ in range(rng.randint(1, 5))]
            if other != words:
                break
        return (reformat(other, rng) if rng.random() < formatting else " ".join(other)), "wrong"
    if r < wrong + formatting:
        return reformat(words, rng), "format"
    return " ".join(words), "clean"
