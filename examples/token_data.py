"""Synthetic token sequences (no downloads): each sample follows ``t[i+1] = (a * t[i] + b) % vocab``
from a random start, with ``a``/``b`` drawn from a few fixed rules, so the loss really drops.
Every sample is a pure function of (seed, index): every rank builds the same dataset and the
distributed sampler gives each rank its own share."""

from __future__ import annotations

from typing import Any, Callable

import torch
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader, Dataset


class TokenSequences(Dataset):
    def __init__(self, num_samples: int, seq_len: int, vocab_size: int, seed: int, rules: int = 4) -> None:
        self.num_samples, self.seq_len, self.vocab_size, self.seed, self.rules = num_samples, seq_len, vocab_size, seed, rules
        self.fault_hook: Callable[[int], None] | None = None
        """Called with the item index before each sample (the examples' fault injection uses it)."""

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.fault_hook is not None:
            self.fault_hook(index)
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        rule = int(torch.randint(self.rules, (1,), generator=gen))
        a, b = 2 * rule + 1, 7 * rule + 3
        seq = torch.empty(self.seq_len + 1, dtype=torch.long)
        seq[0] = int(torch.randint(self.vocab_size, (1,), generator=gen))
        for i in range(self.seq_len):
            seq[i + 1] = (a * seq[i] + b) % self.vocab_size
        return seq[:-1], seq[1:]


class SyntheticTokens(LightningDataModule):
    """``data=synthetic``: ``batch_size`` sequences of ``seq_len`` tokens per rank and step."""

    def __init__(self, vocab_size: int = 128, seq_len: int = 32, num_samples: int = 4096, batch_size: int = 8,
                 num_workers: int = 0, seed: int = 1234) -> None:
        super().__init__()
        self.vocab_size, self.seq_len, self.num_samples = vocab_size, seq_len, num_samples
        self.batch_size, self.num_workers, self.seed = batch_size, num_workers, seed
        self.train_set: TokenSequences | None = None

    def setup(self, stage: str) -> None:
        if self.train_set is None:
            self.train_set = TokenSequences(self.num_samples, self.seq_len, self.vocab_size, self.seed)

    def train_dataloader(self) -> Any:
        assert self.train_set is not None
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True, num_workers=self.num_workers,
                          persistent_workers=self.num_workers > 0, drop_last=True)
