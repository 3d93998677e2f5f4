from __future__ import annotations

import pytest
import torch

from objectives import text_workload
from objectives.text import (
    PAD_TOKEN,
    TokenBucketBatchSampler,
    TokenSequenceDataset,
    pad_collate,
    token_bucket_sampler,
)
from tests.objectives_tests.loaders import CONTEXTS, worker_batches

SMALL = {"sequences": 300, "vocab_size": 64, "max_length": 96}


def test_sequences_are_deterministic_long_tailed_and_compact() -> None:
    dataset = text_workload(**SMALL).dataset
    assert isinstance(dataset, TokenSequenceDataset)
    again = TokenSequenceDataset.generated(300, 64, 96, seed=0)
    assert torch.equal(dataset.tokens, again.tokens) and dataset.lengths == again.lengths
    assert dataset.tokens.dtype == torch.int32 and dataset.tokens.dim() == 1
    assert min(dataset.lengths) >= 8 and max(dataset.lengths) <= 96
    assert len(set(dataset.lengths)) > 30  # spread out, not a few fixed lengths
    assert int(dataset.tokens.min()) >= 1 and int(dataset.tokens.max()) < 64
    assert [len(dataset[index]) for index in range(5)] == dataset.lengths[:5]


def test_workload_fields() -> None:
    workload = text_workload(**SMALL)
    assert (workload.name, workload.batch_param) == ("text", "max_tokens")
    assert (workload.default_batch_size, workload.batch_size_range) == (4096, (1024, 65536))
    assert workload.batch_sampler is token_bucket_sampler
    assert workload.collate_fn is pad_collate
    assert workload.description.startswith("text: 300 sequences of 8–96 tokens")


def _check_epoch(sampler: TokenBucketBatchSampler, lengths: list[int]) -> list[list[int]]:
    expected_batches = len(sampler)
    batches = list(sampler)
    assert len(batches) == expected_batches
    assert sorted(index for batch in batches for index in batch) == list(range(len(lengths)))
    for batch in batches:
        longest = max(lengths[index] for index in batch)
        assert len(batch) * longest <= sampler.max_tokens or len(batch) == 1
    return batches


@pytest.mark.parametrize("max_tokens", [100, 512, 5000])
def test_token_buckets_respect_the_cap_and_cover_every_index_once(max_tokens: int) -> None:
    lengths = text_workload(**SMALL).dataset.lengths  # type: ignore[attr-defined]
    sampler = TokenBucketBatchSampler(lengths, max_tokens, seed=1)
    epochs = [_check_epoch(sampler, lengths) for _ in range(3)]
    assert sampler.epoch == 3
    assert epochs[0] != epochs[1] != epochs[2]
    sampler.set_epoch(1)
    assert list(sampler) == epochs[1]


def test_token_buckets_pack_similar_lengths() -> None:
    lengths = text_workload(**SMALL).dataset.lengths  # type: ignore[attr-defined]
    batches = list(TokenBucketBatchSampler(lengths, 1024, seed=0))
    padded = sum(len(batch) * max(lengths[index] for index in batch) for batch in batches)
    assert sum(lengths) / padded > 0.8


def test_a_sequence_longer_than_the_budget_is_a_batch_of_its_own() -> None:
    lengths = [10, 300, 10, 10, 12]
    batches = list(TokenBucketBatchSampler(lengths, 40, seed=0, shuffle=False))
    assert batches == [[0, 2, 3], [4], [1]]


def test_len_is_the_epoch_in_progress() -> None:
    lengths = text_workload(**SMALL).dataset.lengths  # type: ignore[attr-defined]
    sampler = TokenBucketBatchSampler(lengths, 300, seed=0)
    first = len(sampler)
    iterator = iter(sampler)
    next(iterator)
    assert len(sampler) == first
    del iterator  # an abandoned epoch still ends
    assert sampler.epoch == 1
    assert len(sampler) == len(list(sampler))


def test_the_factory_needs_lengths() -> None:
    with pytest.raises(TypeError, match="has no 'lengths'"):
        token_bucket_sampler(torch.utils.data.TensorDataset(torch.zeros(3)), 100, 0)


def test_pad_collate_pads_to_the_longest() -> None:
    batch = [torch.tensor([5, 6, 7], dtype=torch.int32), torch.tensor([8], dtype=torch.int32)]
    tokens, lengths = pad_collate(batch)
    assert tokens.dtype == torch.int64 and tokens.tolist() == [[5, 6, 7], [8, PAD_TOKEN, 0]]
    assert lengths.tolist() == [3, 1]


@pytest.mark.parametrize("context", CONTEXTS)
def test_workers_serve_a_whole_epoch_and_the_step_trains(context: str) -> None:
    workload = text_workload(**SMALL)
    dataset = workload.dataset
    assert isinstance(dataset, TokenSequenceDataset)
    batches = worker_batches(workload, 1024, context)
    assert len(batches) == len(token_bucket_sampler(dataset, 1024, 0))
    assert sum(int(lengths.sum()) for _, lengths in batches) == sum(dataset.lengths)
    step = workload.train_step(torch.device("cpu"))
    for tokens, lengths in batches[:3]:
        assert tokens.dtype == torch.int64 and tokens.shape == (len(lengths), int(lengths.max()))
        assert tokens.numel() <= 1024
        step((tokens, lengths))
        step.optimizer_step()
        assert step.last_loss is not None and torch.isfinite(step.last_loss)
