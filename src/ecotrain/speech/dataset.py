"""The spoken-digits dataset: a spec of cohorts and speakers, generation (cached, deterministic for
a seed), and `SpeechSource`, what the training loop reads.

A folder made by `generate` holds `features.safetensors` (every utterance's log-mel frames, one
float16 matrix, cut by offsets) and `manifest.json` (per utterance: id, speaker, cohort, split,
transcript, frame count, the features' sha256). The manifest's `key` is a hash of the spec, the
seed and the espeak-ng version: the same key finds the folder already made.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

import torch
from safetensors.torch import load_file, save_file

from ecotrain.base import safefile
from ecotrain.data.sources import DataBundle
from ecotrain.base.errors import DataError
from ecotrain.base.rundir import write_json
from ecotrain.speech.features import N_MELS, log_mel
from ecotrain.speech.transcripts import WORDS, encode
from ecotrain.speech.synth import Speaker, add_noise, espeak_version, render

FORMAT = 1  # bump when generation changes what a spec produces


@dataclass
class Cohort:
    speakers: list[Speaker]
    train: int = 30  # utterances per speaker for training (base) or feedback (new cohorts)
    test: int = 10  # per speaker, held out: the static holdout (base) or the recent slice
    noise_snr_db: Optional[float] = None


@dataclass
class Spec:
    cohorts: dict[str, Cohort] = field(default_factory=dict)
    max_words: int = 5
    seed: int = 0

    def to_json(self) -> dict:
        return {"format": FORMAT, "seed": self.seed, "max_words": self.max_words,
                "cohorts": {k: {**asdict(c), "speakers": [asdict(s) for s in c.speakers]}
                            for k, c in self.cohorts.items()}}

    @staticmethod
    def from_json(d: dict) -> "Spec":
        try:
            cohorts = {k: Cohort([Speaker(**s) for s in c["speakers"]], int(c.get("train", 30)),
                                 int(c.get("test", 10)), c.get("noise_snr_db"))
                       for k, c in d["cohorts"].items()}
            return Spec(cohorts, int(d.get("max_words", 5)), int(d.get("seed", 0)))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise DataError(f"speech data spec: {type(exc).__name__}: {exc}; each cohort needs "
                            "speakers: [{voice, speed, pitch}], train, test") from None


def default_spec(seed: int = 0, scale: float = 1.0) -> Spec:
    """Base voices (American and British English) and three new cohorts: German- and
    Spanish-accented English, and fast, high-pitched speech in noise."""
    n = lambda k: max(1, round(k * scale))  # noqa: E731
    S = Speaker
    return Spec({
        "base": Cohort([S("en-us+m1", 160, 45), S("en-gb+m3", 175, 40), S("en-us+f2", 165, 60),
                        S("en-gb-x-rp+m2", 150, 50)], n(40), n(20)),  # a larger static holdout: a steadier gate
        "accent_de": Cohort([S("de+m1", 160, 50), S("de+f3", 170, 65)], n(40), n(12)),
        "accent_es": Cohort([S("es+m3", 155, 45), S("es+f1", 170, 70)], n(40), n(12)),
        "fast_noisy": Cohort([S("en-us+klatt2", 230, 80), S("en-gb-scotland+f4", 215, 75)], n(40), n(12), 15.0),
    }, seed=seed)


def _plan(spec: Spec) -> list[dict]:
    """Every utterance's id, speaker, cohort, split and words, from the seed alone."""
    rng = random.Random(spec.seed)
    rows = []
    for cohort, c in spec.cohorts.items():
        for spk in c.speakers:
            for split, count in (("train", c.train), ("test", c.test)):
                for i in range(count):
                    words = [rng.choice(WORDS) for _ in range(rng.randint(1, spec.max_words))]
                    rows.append({"id": f"{cohort}/{spk.id}/{split}{i:04d}", "cohort": cohort, "speaker": spk.id,
                                 "split": split, "transcript": " ".join(words), "_spk": spk,
                                 "_noise": c.noise_snr_db})
    return rows


def cache_key(spec: Spec) -> str:
    blob = json.dumps({"spec": spec.to_json(), "espeak": espeak_version(), "n_mels": N_MELS}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def generate(out: Path, spec: Spec, workers: int = 2) -> Path:
    """Render, featurise and write the dataset into `out` (skipped when `out` already holds it)."""
    out = Path(out)
    key = cache_key(spec)
    manifest = out / "manifest.json"
    if manifest.is_file():
        try:
            made = safefile.read_json(manifest, "speech manifest", 64 * safefile.MiB, error=DataError)
            if isinstance(made, dict) and made.get("key") == key and (out / "features.safetensors").is_file():
                return out
        except (OSError, ValueError, DataError):
            pass  # damaged: made again
    if out.exists() and not out.is_dir():
        raise DataError(f"speech data: {out} exists and is not a folder; choose another --out")
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise DataError(f"speech data: cannot write to {out} ({exc.strerror or exc}); choose another --out") from None
    rows = _plan(spec)
    with tempfile.TemporaryDirectory(dir=out) as tmp, ThreadPoolExecutor(max(1, workers)) as pool:
        waves = list(pool.map(lambda r: render(r["transcript"], r["_spk"], Path(tmp)), rows))
    feats, offset = [], 0
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small FFTs: thread start-up costs 20x the work on a busy machine
    try:
        for i, (r, w) in enumerate(zip(rows, waves)):
            if r["_noise"] is not None:
                w = add_noise(w, r["_noise"], spec.seed * 1_000_003 + i)
            f = log_mel(w).to(torch.float16)
            r.update(frames=len(f), offset=offset, sha256=hashlib.sha256(f.numpy().tobytes()).hexdigest())
            feats.append(f)
            offset += len(f)
    finally:
        torch.set_num_threads(threads)
    tmp_path = out / "features.safetensors.tmp"
    save_file({"features": torch.cat(feats).contiguous()}, str(tmp_path))
    tmp_path.replace(out / "features.safetensors")
    utts = [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows]
    write_json(manifest, {"key": key, "espeak": espeak_version(), "spec": spec.to_json(), "n_mels": N_MELS,
                          "utterances": utts})
    return out


@dataclass
class SpeechData:
    """A generated folder in memory: features [frames, n_mels] and the manifest's rows."""

    features: torch.Tensor
    rows: list[dict]

    def select(self, **match) -> list[int]:
        return [i for i, r in enumerate(self.rows) if all(r[k] == v for k, v in match.items())]

    def source(self, idx: list[int], transcripts: Optional[list[list[str]]] = None) -> "SpeechSource":
        """Utterances `idx`, labelled with their true words or with `transcripts` (normalised words)."""
        if transcripts is None:
            transcripts = [self.rows[i]["transcript"].split() for i in idx]
        segs = [self.features[self.rows[i]["offset"]: self.rows[i]["offset"] + self.rows[i]["frames"]] for i in idx]
        return SpeechSource(segs, [encode(t) for t in transcripts], [self.rows[i]["cohort"] for i in idx])


def load(folder: Path) -> SpeechData:
    folder = Path(folder)
    try:
        meta = safefile.read_json(folder / "manifest.json", "speech manifest", 64 * safefile.MiB, error=DataError)
        feats = load_file(str(safefile.regular(folder / "features.safetensors", "speech features file",
                                               error=DataError)))["features"].float()
        if not isinstance(meta, dict) or not isinstance(meta.get("utterances"), list):
            raise DataError(f"speech data: {folder / 'manifest.json'} lists no utterances; make it again")
    except FileNotFoundError as exc:
        raise DataError(f"speech data: {exc.filename} not found; make it with `ecotrain data speech-digits --out {folder}`") from None
    except DataError:  # safefile's line: a FIFO or device in a file's place, JSON that does not parse
        raise
    except Exception as exc:  # a truncated safetensors file (SafetensorError), a missing key
        raise DataError(f"speech data: {folder} is damaged ({type(exc).__name__}: {exc}); make it again") from None
    return SpeechData(feats, meta["utterances"])


class SpeechSource:
    """Variable-length utterances. `take(idx)` pads the batch to its longest member and returns
    x [b, T, n_mels] and y [b, 2 + L]: y[:, 0] frame counts, y[:, 1] label lengths, y[:, 2:] word
    ids (0-padded). One tensor, so the loop's micro-batching and device moves need nothing new."""

    def __init__(self, segs: list[torch.Tensor], labels: list[list[int]], cohorts: list[str]):
        self.segs, self.label_ids, self.cohorts = segs, labels, cohorts
        self.lengths = torch.tensor([len(s) for s in segs])

    def __len__(self) -> int:
        return len(self.segs)

    def take(self, idx: torch.Tensor):
        ids = idx.tolist()
        t = max(len(self.segs[i]) for i in ids)
        n_lab = max(1, max(len(self.label_ids[i]) for i in ids))
        x = torch.zeros(len(ids), t, self.segs[ids[0]].shape[1])
        y = torch.zeros(len(ids), 2 + n_lab, dtype=torch.long)
        for j, i in enumerate(ids):
            x[j, : len(self.segs[i])] = self.segs[i]
            lab = self.label_ids[i]
            y[j, 0], y[j, 1] = len(self.segs[i]), len(lab)
            y[j, 2: 2 + len(lab)] = torch.tensor(lab, dtype=torch.long)
        return x, y

    def labels(self) -> torch.Tensor:
        return torch.tensor([len(lab) for lab in self.label_ids])  # stratify-free: only counts

    def subset(self, idx: list[int]) -> "SpeechSource":
        return SpeechSource([self.segs[i] for i in idx], [self.label_ids[i] for i in idx],
                            [self.cohorts[i] for i in idx])

    def __add__(self, other: "SpeechSource") -> "SpeechSource":
        return SpeechSource(self.segs + other.segs, self.label_ids + other.label_ids, self.cohorts + other.cohorts)

    def hash_into(self, h) -> None:
        for s, lab in zip(self.segs, self.label_ids):
            h.update(s.to(torch.float16).numpy().tobytes())
            h.update(bytes(lab))


def bundle(train: SpeechSource, val: Optional[SpeechSource] = None):
    """A DataBundle for `fit`: bucketing reads `extra['lengths']`."""
    return DataBundle(train, val, None, None, (train.segs[0].shape[1],), extra={"lengths": train.lengths})
