"""Speech recognition that learns from user feedback: spoken digit sequences rendered offline with
espeak-ng (`synth.py`), log-mel features in torch (`features.py`), a conv + GRU acoustic model
trained with CTC over word tokens (`model.py`, `ctc.py`), the dataset and its cache (`dataset.py`),
transcript normalisation and label checks (`labels.py`), and the feedback rounds (`feedback.py`).
See docs/speech.md.
"""

# No eager imports: `ecotrain --help` loads cli/commands/ (data.py, speech_feedback.py) and must not import torch.
