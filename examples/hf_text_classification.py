"""A Hugging Face model on dict batches: BertForSequenceClassification from a tiny config (no hub
download), trained on generated text by ecotrain. The model computes its own loss from the batch's
`labels`, so ecotrain's task is `model_loss` (chosen automatically for dict batches).

    python examples/hf_text_classification.py --run-dir runs/hf
    python examples/hf_text_classification.py --run-dir runs/hf --resume   # after a kill: exact resume

Needs the `adapters` extra (it brings transformers): pip install 'ecotrain[adapters]'.
"""

from __future__ import annotations

import argparse
import random

import torch

import ecotrain

WORDS = ["the", "a", "film", "plot", "actor", "music", "story", "was", "is", "very", "quite", "really"]
GOOD, BAD = ["great", "superb", "lovely", "brilliant"], ["awful", "boring", "dreadful", "poor"]
VOCAB = ["[PAD]", "[CLS]", "[SEP]", *WORDS, *GOOD, *BAD]
MAX_LEN = 16


def make_reviews(n: int, seed: int) -> list[tuple[str, int]]:
    """Short generated reviews; the label is whether the sentiment words are good (1) or bad (0)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        label = rng.randrange(2)
        words = [rng.choice(WORDS) for _ in range(rng.randint(4, 9))]
        for _ in range(rng.randint(1, 2)):
            words.insert(rng.randrange(len(words) + 1), rng.choice(GOOD if label else BAD))
        out.append((" ".join(words), label))
    return out


class Reviews(torch.utils.data.Dataset):
    """Items are dicts, as a Hugging Face tokenizer gives them: input_ids, attention_mask, labels."""

    def __init__(self, reviews: list[tuple[str, int]]):
        self.reviews = reviews
        self.labels = [label for _, label in reviews]  # read by ecotrain only if a feature needs labels

    def __len__(self) -> int:
        return len(self.reviews)

    def __getitem__(self, i: int) -> dict:
        text, label = self.reviews[i]
        ids = [1] + [VOCAB.index(w) for w in text.split()][: MAX_LEN - 2] + [2]
        pad = MAX_LEN - len(ids)
        return {"input_ids": torch.tensor(ids + [0] * pad), "attention_mask": torch.tensor([1] * len(ids) + [0] * pad),
                "labels": torch.tensor(label)}


def tiny_bert():
    from transformers import BertConfig, BertForSequenceClassification

    cfg = BertConfig(vocab_size=len(VOCAB), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=MAX_LEN, num_labels=2)
    return BertForSequenceClassification(cfg)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run-dir", default="runs/hf_text")
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--samples", type=int, default=1200)
    p.add_argument("--resume", action="store_true", help="continue from the run folder's newest checkpoint")
    p.add_argument("--checkpoint-every", type=int, default=20)
    args = p.parse_args(argv)

    torch.manual_seed(0)
    model = tiny_bert()
    reviews = make_reviews(args.samples, seed=0)
    cut = int(0.8 * len(reviews))
    data = {"train": Reviews(reviews[:cut]), "val": Reviews(reviews[cut:])}
    cfg = ecotrain.Config.model_validate({
        "name": "hf_text", "data": {"batch_size": 32}, "optim": {"lr": 3e-3, "weight_decay": 0.01},
        "schedule": {"name": "cosine", "warmup": 10},
        "loop": {"max_steps": args.steps, "max_epochs": None, "eval_every": 50, "log_every": 10},
        "checkpoint": {"every_n_steps": args.checkpoint_every}, "ledger": {"energy": "off"},
    })
    result = ecotrain.fit(cfg, model=model, data=data, run_dir=args.run_dir, quiet=True,
                          resume="auto" if args.resume else None, overwrite=not args.resume)
    s = result.summary
    print(f"hf_text: task={result.state.task.name} steps={s['steps']} val_accuracy={s.get('val_accuracy', float('nan')):.3f}")
    return s


if __name__ == "__main__":
    main()
