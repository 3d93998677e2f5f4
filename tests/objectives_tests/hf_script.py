"""A user's Hugging Face training script: a tiny BERT built from a config, token ids made in code.

Loaded by the tests as ``path/to/hf_script.py:attr``, as ``--objective`` takes it: the tuner calls
``workload()`` in the study and in every trial's child process, each building its own Trainer.
The dataset carries a string column (``text``) that the Trainer drops before loading, as it does
for every column the model's ``forward`` does not take. Nothing is downloaded.
"""

from __future__ import annotations

import os
import tempfile

import datasets
import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

from objectives import Workload
from tuner.integrations.huggingface import workload_from_trainer

SAMPLES = 256
LENGTH = 16


def make_dataset() -> datasets.Dataset:
    ids = torch.randint(1, 64, (SAMPLES, LENGTH), generator=torch.Generator().manual_seed(0))
    return datasets.Dataset.from_dict(
        {
            "input_ids": ids.tolist(),
            "attention_mask": [[1] * LENGTH] * SAMPLES,
            "label": [i % 2 for i in range(SAMPLES)],
            "text": [f"sample {i}" for i in range(SAMPLES)],
        }
    )


class TokenDicts(torch.utils.data.Dataset):
    """A plain torch dataset of dicts, with a key (``id``) the model's forward does not take."""

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int) -> dict[str, object]:
        ids = torch.arange(LENGTH) % 63 + 1
        return {"input_ids": ids, "label": index % 2, "id": f"sample-{index}"}


def make_model() -> BertForSequenceClassification:
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=64,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=LENGTH,
        num_labels=2,
    )
    return BertForSequenceClassification(config)


def make_args(**overrides: object) -> TrainingArguments:
    """What this script trains with today: batch 12, two workers prefetching 3, persistent."""
    fields: dict[str, object] = {
        "output_dir": os.path.join(tempfile.gettempdir(), "hf-script-out"),
        "per_device_train_batch_size": 12,
        "dataloader_num_workers": 2,
        "dataloader_prefetch_factor": 3,
        "dataloader_persistent_workers": True,
        "dataloader_pin_memory": False,
        "learning_rate": 1e-2,
        "report_to": "none",
        "use_cpu": True,
    }
    return TrainingArguments(**{**fields, **overrides})


def make_trainer(args: TrainingArguments | None = None, **kwargs: object) -> Trainer:
    fields: dict[str, object] = {"train_dataset": make_dataset()}
    return Trainer(model=make_model(), args=args or make_args(), **{**fields, **kwargs})


def workload() -> Workload:
    """What ``--objective hf_script.py:workload`` runs: the Trainer's pipeline and step."""
    return workload_from_trainer(make_trainer())


def no_dataset() -> Workload:
    return workload_from_trainer(make_trainer(train_dataset=None))


def streaming() -> Workload:
    iterable = make_dataset().to_iterable_dataset()  # a Trainer streams it only with max_steps
    return workload_from_trainer(make_trainer(make_args(max_steps=10), train_dataset=iterable))


def batch_rebalance() -> Workload:
    return workload_from_trainer(make_trainer(make_args(train_sampling_strategy="batch_rebalance")))


def not_a_trainer() -> Workload:
    return workload_from_trainer(make_args())
