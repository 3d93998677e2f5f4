"""The built-in storage-latency workload: samples that wait on remote storage, a small MLP step.

Each ``__getitem__`` sleeps ``latency_ms`` (an object store or NFS read answered after that long)
and then builds a small feature vector, so a sample costs little CPU and much waiting. Such a
loader needs many more workers than the machine has cores: throughput follows
``num_workers / latency`` until the CPU (IPC, collate, the step) or process overhead bends it.
The features are generated from the index, so every epoch and every worker sees the same data.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from objectives._workload import Workload

__all__ = ["LatencyDataset", "MlpStep", "mlp", "storage_workload"]

NUM_CLASSES = 10


class LatencyDataset(Dataset):
    """``samples`` feature vectors, each returned after waiting ``latency_ms`` milliseconds."""

    def __init__(self, samples: int, features: int, latency_ms: float, seed: int = 0) -> None:
        if samples < 1 or features < 1 or latency_ms < 0:
            raise ValueError("samples and features must be positive and latency_ms not negative")
        self.samples = samples
        self.features = features
        self.latency_s = latency_ms / 1000
        self.seed = seed

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        time.sleep(self.latency_s)  # the storage round trip: waiting, not CPU
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        return torch.randn(self.features, generator=generator), index % NUM_CLASSES


def mlp(features: int, hidden: int) -> nn.Module:
    """The storage workload's model: two linear layers."""
    return nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, NUM_CLASSES))


class MlpStep:
    """Cross-entropy and SGD on the :func:`mlp` on ``device`` (under DDP in a rank of several):
    a cheap step, so the loader decides the speed."""

    def __init__(self, device: torch.device, network: nn.Module) -> None:
        self.network = network.to(device)
        self.optimizer = torch.optim.SGD(self.network.parameters(), lr=0.01, momentum=0.9)

    def __call__(self, batch: Any) -> None:
        features, labels = batch
        F.cross_entropy(self.network(features), labels).backward()

    def optimizer_step(self) -> None:
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def storage_workload(
    samples: int = 4096,
    features: int = 256,
    hidden: int = 256,
    latency_ms: int = 8,
    seed: int = 0,
) -> Workload:
    """``samples`` samples behind ``latency_ms`` of storage latency each, a small MLP step."""
    return Workload(
        name="storage",
        dataset=LatencyDataset(samples, features, float(latency_ms), seed),
        make_step=MlpStep,
        model=mlp(features, hidden),
        default_batch_size=32,
        batch_size_range=(8, 512),
        description=(
            f"storage: {samples} samples of {features} features, {latency_ms} ms latency each, "
            f"MLP {features}-{hidden}-{NUM_CLASSES}"
        ),
    )
