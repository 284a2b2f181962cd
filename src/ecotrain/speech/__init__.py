"""Speech recognition that learns from user feedback: spoken digit sequences rendered offline with
espeak-ng (`synth.py`), log-mel features in torch (`features.py`), a conv + GRU acoustic model
trained with CTC over word tokens (`model.py`, `ctc.py`), the dataset and its cache (`dataset.py`),
transcript normalisation and label checks (`labels.py`), and the feedback rounds (`feedback.py`).
See docs/speech.md.
"""

from ecotrain.speech.ctc import CTCTask, greedy_decode, word_error_rate
from ecotrain.speech.features import log_mel, mel_filterbank
from ecotrain.speech.labels import VOCAB, normalize_transcript

__all__ = ["CTCTask", "VOCAB", "greedy_decode", "log_mel", "mel_filterbank", "normalize_transcript",
           "word_error_rate"]
