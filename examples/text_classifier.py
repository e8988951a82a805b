"""A text classifier as an autotune workload: token ids, padding in collate_fn, dict batches.

A small ``nn.TransformerEncoder`` classifies variable-length sequences of
token ids. The dataset returns one unpadded sequence per item; ``pad_batch``
pads a batch to its longest sequence and returns a Hugging Face style dict
(``input_ids``, ``padding_mask``, ``labels``), so the Task gives ``step=``
rather than ``loss=``. Tune it with::

    cd examples && autotune search --workload text_classifier:make_task --trials 3 --trial-seconds 1 --device cpu

or run this file, which does the same through the Python API and then runs
the emitted ``train.py`` for two steps. ``make_large_task`` is the size the
benchmark uses (``python -m benchmarks.run --workload text-transformer``),
where the loader and collate cost matter.
"""

from __future__ import annotations

import random
import sys
import zlib

import torch
from torch import nn
from torch.utils.data import Dataset

import autotune

PAD = 0


LETTERS = "abcdefghijklmnopqrstuvwxyz"


def wordpiece(word: str, vocab: int) -> list[int]:
    """Greedy longest-match subword ids (pieces of up to 3 letters), as a pure-Python WordPiece tokenizer does."""
    ids, start = [], 0
    while start < len(word):
        end = min(len(word), start + 3)
        piece = word[start:end]
        ids.append(1 + zlib.crc32(piece.encode() if start == 0 else b"##" + piece.encode()) % (vocab - 1))
        start = end
    return ids


class TokenSequences(Dataset):
    """Deterministic random texts of varying length, tokenized in ``__getitem__``, with a class label each.

    Each item is a sentence of random words, lower-cased, split and cut into
    subword ids in Python, as when a text dataset is tokenized on the fly:
    the loader does real per-sample work.
    """

    def __init__(self, samples: int, vocab: int, min_len: int, max_len: int, classes: int, seed: int = 0) -> None:
        self.samples, self.vocab, self.min_len, self.max_len, self.classes, self.seed = samples, vocab, min_len, max_len, classes, seed

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        rng = random.Random(self.seed * 1_000_003 + index)
        words = ("".join(rng.choices(LETTERS, k=rng.randint(2, 9))) for _ in range(rng.randint(self.min_len, self.max_len) // 2 + 1))
        text = " ".join(words).capitalize() + "."
        ids = [i for word in text.lower().rstrip(".").split() for i in wordpiece(word, self.vocab)][: self.max_len]
        return torch.tensor(ids), ids[0] % self.classes  # a label the model can learn from the first token


def pad_batch(items: list[tuple[torch.Tensor, int]]) -> dict[str, torch.Tensor]:
    """Pad to the longest sequence of the batch; a dict batch as tokenizers return it."""
    tokens = nn.utils.rnn.pad_sequence([t for t, _ in items], batch_first=True, padding_value=PAD)
    return {"input_ids": tokens, "padding_mask": tokens == PAD, "labels": torch.tensor([label for _, label in items])}


class TextClassifier(nn.Module):
    """Embedding, a TransformerEncoder, mean pooling over the real tokens, a linear head."""

    def __init__(self, vocab: int, dim: int, layers: int, heads: int, classes: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim, padding_idx=PAD)
        layer = nn.TransformerEncoderLayer(dim, heads, dim_feedforward=2 * dim, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(dim, classes)

    def forward(self, input_ids: torch.Tensor, padding_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.encoder(self.embed(input_ids), src_key_padding_mask=padding_mask)
        keep = (~padding_mask).unsqueeze(-1).to(hidden.dtype)
        return self.head((hidden * keep).sum(1) / keep.sum(1).clamp(min=1))


def step(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The loss of one dict batch."""
    logits = model(batch["input_ids"], batch["padding_mask"])
    return nn.functional.cross_entropy(logits, batch["labels"])


def _task(samples: int, max_len: int, dim: int, layers: int, vocab: int = 1000, classes: int = 4) -> autotune.Task:
    return autotune.Task(
        model=lambda: TextClassifier(vocab, dim, layers, heads=4, classes=classes),
        dataset=TokenSequences(samples, vocab, min_len=max_len // 4, max_len=max_len, classes=classes),
        step=step,
        collate_fn=pad_batch,
        batch_size=32,
        lr=3e-4,
    )


def make_task() -> autotune.Task:
    """The tiny size the tests tune: 256 sequences of up to 32 tokens, 1 layer of width 32."""
    return _task(samples=256, max_len=32, dim=32, layers=1)


def make_large_task() -> autotune.Task:
    """The benchmark size: 20,000 texts of up to 64 tokens, tokenized per item; 1 layer of width 32."""
    return _task(samples=20_000, max_len=64, dim=32, layers=1, vocab=8000)


if __name__ == "__main__":
    from _run_example import run_example

    sys.exit(run_example("text_classifier:make_task", *sys.argv[1:2]))
