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

import sys

import torch
from torch import nn
from torch.utils.data import Dataset

import autotune

PAD = 0


class TokenSequences(Dataset):
    """Deterministic random token-id sequences of varying length, with a class label each."""

    def __init__(self, samples: int, vocab: int, min_len: int, max_len: int, classes: int, seed: int = 0) -> None:
        self.samples, self.vocab, self.min_len, self.max_len, self.classes, self.seed = samples, vocab, min_len, max_len, classes, seed

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        length = int(torch.randint(self.min_len, self.max_len + 1, (1,), generator=gen))
        tokens = torch.randint(1, self.vocab, (length,), generator=gen)
        return tokens, int(tokens[0]) % self.classes  # a label the model can learn from the first token


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
    """The benchmark size: 20,000 sequences of up to 256 tokens, 2 layers of width 128."""
    return _task(samples=20_000, max_len=256, dim=128, layers=2, vocab=8000)


if __name__ == "__main__":
    from _run_example import run_example

    sys.exit(run_example("text_classifier:make_task"))
