"""The built-in text workload: variable-length token sequences, token-budget batches, a tiny LM.

Its batch parameter is a token budget (``max_tokens``), not a sample count, which is how language
models are trained: the batch sampler packs sequences of similar length so padding stays small.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, Sampler

from objectives._workload import Workload

__all__ = [
    "PAD_TOKEN",
    "TokenBucketBatchSampler",
    "TokenSequenceDataset",
    "pad_collate",
    "text_workload",
    "token_bucket_sampler",
]

PAD_TOKEN = 0
"""Padding id; generated tokens are drawn from ``1 .. vocab_size - 1``."""
MIN_LENGTH = 8
_CHUNK_BATCHES = 100  # sort within chunks of ~100 batches: little padding, still random batches
_MODEL_DIM = 128


def text_workload(
    sequences: int = 4096, vocab_size: int = 2048, max_length: int = 512, seed: int = 0
) -> Workload:
    """Language modelling on ``sequences`` random token sequences with long-tailed lengths."""
    dataset = TokenSequenceDataset.generated(sequences, vocab_size, max_length, seed)
    return Workload(
        name="text",
        dataset=dataset,
        collate_fn=pad_collate,
        make_step=LanguageModelStep,
        model=TinyLanguageModel(vocab_size),
        default_batch_size=4096,
        batch_size_range=(1024, 65536),
        batch_sampler=token_bucket_sampler,
        batch_param="max_tokens",
        description=(
            f"text: {sequences} sequences of {MIN_LENGTH}–{max_length} tokens (lognormal), "
            f"vocab {vocab_size}, 1-layer transformer"
        ),
    )


class TokenSequenceDataset(Dataset):
    """Sequences stored as one flat int32 tensor plus offsets.

    Two tensors instead of a list of tensors: forked workers share the pages untouched (no
    per-object refcounts to write), and ``spawn`` moves two storages to shared memory, not
    thousands. ``lengths`` is for the batch sampler, which lives in the main process.
    """

    def __init__(self, tokens: torch.Tensor, offsets: torch.Tensor) -> None:
        self.tokens = tokens
        self.offsets = offsets
        self.lengths: list[int] = offsets.diff().tolist()

    @classmethod
    def generated(
        cls, sequences: int, vocab_size: int, max_length: int, seed: int
    ) -> TokenSequenceDataset:
        """Lengths lognormal around ``max_length / 8``, clipped to ``[8, max_length]``."""
        if sequences < 1:
            raise ValueError(f"sequences must be at least 1, got {sequences}")
        if vocab_size < 2:
            raise ValueError(f"vocab_size must be at least 2 (one id is padding), got {vocab_size}")
        if max_length < MIN_LENGTH:
            raise ValueError(f"max_length must be at least {MIN_LENGTH}, got {max_length}")
        generator = torch.Generator().manual_seed(seed)
        median = math.log(max(MIN_LENGTH, max_length / 8))
        lengths = torch.empty(sequences, dtype=torch.float64).log_normal_(
            median, 1.0, generator=generator
        )
        lengths = lengths.round().clamp_(MIN_LENGTH, max_length).to(torch.int64)
        offsets = torch.zeros(sequences + 1, dtype=torch.int64)
        torch.cumsum(lengths, 0, out=offsets[1:])
        total = int(offsets[-1])
        tokens = torch.randint(1, vocab_size, (total,), generator=generator, dtype=torch.int32)
        return cls(tokens, offsets)

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> torch.Tensor:
        start, end = self.offsets[index : index + 2].tolist()
        return self.tokens[start:end]


def pad_collate(batch: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tokens, lengths)``: int64 ``[B, T]`` padded with :data:`PAD_TOKEN` to the longest."""
    lengths = torch.tensor([len(sequence) for sequence in batch], dtype=torch.int64)
    tokens = torch.full((len(batch), int(lengths.max())), PAD_TOKEN, dtype=torch.int64)
    for row, sequence in enumerate(batch):
        tokens[row, : len(sequence)] = sequence
    return tokens, lengths


class TokenBucketBatchSampler(Sampler[list[int]]):
    """Batches of similar-length indices with ``len(batch) * longest <= max_tokens``.

    Each epoch shuffles the indices, sorts them by length within chunks of about 100 batches,
    packs them greedily and shuffles the batch order. A sequence longer than ``max_tokens`` is
    a batch of its own. Epochs advance when an iteration ends (or is abandoned) and can be set
    with :meth:`set_epoch`; ``len()`` is the number of batches of the epoch in progress, or of
    the next one between epochs.
    """

    def __init__(
        self, lengths: Sequence[int], max_tokens: int, seed: int = 0, shuffle: bool = True
    ) -> None:
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
        self.lengths = [int(length) for length in lengths]
        if not self.lengths:
            raise ValueError("TokenBucketBatchSampler needs at least one sequence")
        self.max_tokens = max_tokens
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        mean_length = sum(self.lengths) / len(self.lengths)
        self._chunk_size = max(1, int(max_tokens / mean_length)) * _CHUNK_BATCHES
        self._planned: tuple[int, list[list[int]]] | None = None

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration epoch ``epoch`` (as ``DistributedSampler.set_epoch``)."""
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self._batches(self.epoch))

    def __iter__(self) -> Iterator[list[int]]:
        epoch = self.epoch
        try:
            yield from self._batches(epoch)
        finally:
            if self.epoch == epoch:
                self.epoch = epoch + 1

    def _batches(self, epoch: int) -> list[list[int]]:
        if self._planned is None or self._planned[0] != epoch:
            self._planned = epoch, self._plan(epoch)
        return self._planned[1]

    def _plan(self, epoch: int) -> list[list[int]]:
        rng = random.Random(f"{self.seed}:{epoch}")
        order = list(range(len(self.lengths)))
        if self.shuffle:
            rng.shuffle(order)
        batches: list[list[int]] = []
        for start in range(0, len(order), self._chunk_size):
            chunk = sorted(order[start : start + self._chunk_size], key=self.lengths.__getitem__)
            batch: list[int] = []
            for index in chunk:
                # Ascending lengths: this sequence is the longest of the batch it joins.
                if batch and (len(batch) + 1) * self.lengths[index] > self.max_tokens:
                    batches.append(batch)
                    batch = []
                batch.append(index)
            batches.append(batch)
        if self.shuffle:
            rng.shuffle(batches)
        return batches


def token_bucket_sampler(dataset: Dataset, max_tokens: int, seed: int) -> TokenBucketBatchSampler:
    """The :data:`~objectives._workload.BatchSamplerFactory` for datasets with ``lengths``."""
    lengths = getattr(dataset, "lengths", None)
    if lengths is None:
        raise TypeError(f"{type(dataset).__name__} has no 'lengths' for token-bucket batching")
    return TokenBucketBatchSampler(lengths, max_tokens, seed)


# Training step ------------------------------------------------------------------------------


class TinyLanguageModel(nn.Module):
    """Embedding, one causal transformer encoder layer, and a linear LM head."""

    def __init__(self, vocab_size: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, _MODEL_DIM, padding_idx=PAD_TOKEN)
        # No dropout: this model exists to be timed, and its random masks cost 5% of a CPU step.
        self.layer = nn.TransformerEncoderLayer(
            d_model=_MODEL_DIM, nhead=4, dim_feedforward=256, dropout=0.0, batch_first=True
        )
        self.head = nn.Linear(_MODEL_DIM, vocab_size)

    def forward(self, tokens: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, T, vocab]``; ``padding`` is True where a position is padding."""
        length = tokens.shape[1]
        causal = torch.ones(length, length, dtype=torch.bool, device=tokens.device).triu_(1)
        hidden = self.layer(
            self.embedding(tokens), src_mask=causal, src_key_padding_mask=padding, is_causal=True
        )
        return self.head(hidden)


class LanguageModelStep:
    """Next-token cross entropy, padding ignored, AdamW.

    The padding mask comes from the tokens themselves (padding is the only ``PAD_TOKEN``), and
    no step reads a value back, so the host never waits for the device inside a step. ``model``
    is the workload's :class:`TinyLanguageModel` on ``device`` (under DDP in a rank of several).
    """

    def __init__(self, device: torch.device, model: nn.Module) -> None:
        self.model = model.to(device).train()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=3e-4)
        self.last_loss: torch.Tensor | None = None

    def __call__(self, batch: Any) -> None:
        tokens, _lengths = batch
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        logits = self.model(inputs, inputs == PAD_TOKEN)
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=PAD_TOKEN)
        loss.backward()
        self.last_loss = loss.detach()

    def optimizer_step(self) -> None:
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
