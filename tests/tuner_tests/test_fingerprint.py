"""The fingerprint: this machine read for real, names and attrs from constructed fingerprints."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from tuner.machine import _gpu
from tuner.machine._fingerprint import (
    GIB,
    Fingerprint,
    auto_profile_name,
    cpu_model_name,
    detect_fingerprint,
    gpu_model_slug,
    read_gpus,
    usable_cores,
    usable_cpu_count,
)
from tuner.machine._profiles import Profile, load_catalog, profile_mismatches, resolve_profile
from tuner.testing import StaticGpuReader

STUDY_NAME_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.-]*$")


def make_fingerprint(**changes: Any) -> Fingerprint:
    """A fingerprint shaped like the 2-CPU, ~23.5 GiB, GPU-less build machine."""
    base = Fingerprint(
        hostname="test-host",
        cpu_model="AMD EPYC",
        logical_cpus=2,
        usable_cpus=2,
        physical_cores=2,
        memory_bytes=25_275_973_632,
        cgroup_memory_limit_bytes=None,
        gpus=(),
        gpu_driver=None,
        torch_version="2.13.0+cpu",
        cuda_version=None,
        cuda_available=False,
    )
    return dataclasses.replace(base, **changes)


@pytest.fixture
def catalog(monkeypatch: pytest.MonkeyPatch) -> dict[str, Profile]:
    monkeypatch.delenv("TUNER_PROFILES", raising=False)
    return load_catalog()


# --------------------------------------------------------------------------- this machine


def test_detect_fingerprint_on_this_machine() -> None:
    import torch

    fp = detect_fingerprint()
    assert fp.hostname
    assert fp.cpu_model
    assert 1 <= fp.usable_cpus <= fp.logical_cpus == os.cpu_count()
    assert fp.usable_cpus <= len(os.sched_getaffinity(0))
    assert 1 <= fp.physical_cores <= fp.logical_cpus
    assert fp.memory_bytes > GIB
    assert 0 < fp.usable_memory_bytes <= fp.memory_bytes
    assert fp.torch_version == torch.__version__
    assert fp.cuda_version == torch.version.cuda
    assert fp.cuda_available == torch.cuda.is_available()
    assert all(name and size > 0 for name, size in fp.gpus)
    assert (fp.gpu_driver is not None) == bool(fp.gpus)


def test_detect_fingerprint_is_cached() -> None:
    assert detect_fingerprint() is detect_fingerprint()


def test_auto_name_on_this_machine() -> None:
    fp = detect_fingerprint()
    gpu_part = r"(\d+x[a-z0-9]+-?)+" if fp.gpus else "nogpu"
    # On the 2-CPU build machine without a GPU this is local-2cpu-<n>g-nogpu.
    assert re.fullmatch(rf"local-{usable_cpu_count()}cpu-\d+g-{gpu_part}", auto_profile_name(fp))


def test_auto_profile_matches_this_machine(catalog: dict[str, Profile]) -> None:
    fp = detect_fingerprint()
    profile = resolve_profile("auto", catalog, fp)
    assert profile.name == auto_profile_name(fp)
    assert profile_mismatches(profile, fp) == []


def test_g4dn_xlarge_lists_each_difference_of_a_machine(catalog: dict[str, Profile]) -> None:
    """This machine's fingerprint with its CPUs, RAM and GPUs set by hand, so every line is
    checked wherever the test runs."""
    here = detect_fingerprint()
    profile = catalog["g4dn.xlarge"]
    same = dataclasses.replace(
        here,
        usable_cpus=4,
        memory_bytes=16 * 2**30,
        cgroup_memory_limit_bytes=None,
        gpus=(("Tesla T4", 15 * 2**30),),
    )
    assert profile_mismatches(profile, same) == []
    small = dataclasses.replace(same, usable_cpus=2, gpus=())
    assert profile_mismatches(profile, small) == [
        "vCPUs: profile g4dn.xlarge has 4, this machine has 2",
        "GPUs: profile g4dn.xlarge has 1x t4, this machine has no GPU",
    ]
    capped = dataclasses.replace(same, cgroup_memory_limit_bytes=4 * 2**30)
    assert [line.split(":")[0] for line in profile_mismatches(profile, capped)] == ["memory"]


# --------------------------------------------------------------------------- readers


def test_read_gpus_orders_devices_and_reads_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    reader = StaticGpuReader(
        [_gpu.GpuDevice(1, "Tesla T4", 15 * GIB), _gpu.GpuDevice(0, "NVIDIA A100", 40 * GIB)],
        driver_version="550.54.15",
    )
    monkeypatch.setattr(_gpu, "open_gpu_reader", lambda log=None: reader)
    gpus, driver = read_gpus()
    assert gpus == (("NVIDIA A100", 40 * GIB), ("Tesla T4", 15 * GIB))
    assert driver == "550.54.15"
    assert reader.closed


def test_read_gpus_without_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_gpu, "open_gpu_reader", lambda log=None: _gpu.NoGpuReader("none"))
    assert read_gpus() == ((), None)


def test_usable_cores_are_this_process_affinity() -> None:
    assert usable_cores() == sorted(os.sched_getaffinity(0))
    assert 1 <= usable_cpu_count() <= len(os.sched_getaffinity(0))


def test_cpu_model_name_from_cpuinfo(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8375C\n")
    assert cpu_model_name(cpuinfo) == "Intel(R) Xeon(R) Platinum 8375C"
    assert cpu_model_name(tmp_path / "missing")  # platform.processor() or "unknown"


# --------------------------------------------------------------------------- names


@pytest.mark.parametrize(
    ("device_name", "slug"),
    [
        ("Tesla T4", "t4"),
        ("NVIDIA A10G", "a10g"),
        ("Tesla V100-SXM2-16GB", "v100"),
        ("NVIDIA A100-SXM4-40GB", "a100"),
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA H200", "h200"),
        ("NVIDIA L4", "l4"),
        ("NVIDIA GeForce RTX 4090", "rtx4090"),
    ],
)
def test_gpu_model_slug(device_name: str, slug: str) -> None:
    assert gpu_model_slug(device_name) == slug


def test_auto_name_without_gpu() -> None:
    assert auto_profile_name(make_fingerprint()) == "local-2cpu-23g-nogpu"


def test_auto_name_with_gpus() -> None:
    h200 = make_fingerprint(
        usable_cpus=16, memory_bytes=125 * GIB + 123_456, gpus=(("NVIDIA H200", 141 * GIB),)
    )
    assert auto_profile_name(h200) == "local-16cpu-125g-1xh200"
    a100s = make_fingerprint(
        usable_cpus=96,
        memory_bytes=1152 * GIB,
        gpus=tuple(("NVIDIA A100-SXM4-40GB", 40 * GIB) for _ in range(8)),
    )
    assert auto_profile_name(a100s) == "local-96cpu-1152g-8xa100"


def test_auto_name_mixed_gpus_is_order_independent() -> None:
    gpus = (("Tesla T4", 15 * GIB), ("NVIDIA A100-PCIE-40GB", 40 * GIB))
    forward = auto_profile_name(make_fingerprint(gpus=gpus))
    backward = auto_profile_name(make_fingerprint(gpus=gpus[::-1]))
    assert forward == backward == "local-2cpu-23g-1xa100-1xt4"
    assert STUDY_NAME_PART.match(forward)


def test_auto_name_uses_cgroup_memory_limit() -> None:
    fp = make_fingerprint(cgroup_memory_limit_bytes=8 * GIB + GIB // 2)
    assert auto_profile_name(fp) == "local-2cpu-8g-nogpu"


def test_profile_from_fingerprint_with_gpu() -> None:
    fp = make_fingerprint(usable_cpus=4, memory_bytes=15 * GIB, gpus=(("Tesla T4", 15 * GIB),))
    profile = Profile.from_fingerprint(fp)
    assert profile == Profile(
        name="local-4cpu-15g-1xt4",
        vcpus=4,
        memory_bytes=15 * GIB,
        gpu_count=1,
        gpu_model="t4",
        gpu_memory_bytes=15 * GIB,
        description="auto-detected: AMD EPYC",
    )
    assert profile_mismatches(profile, fp) == []


# --------------------------------------------------------------------------- attrs


@pytest.mark.parametrize(
    "fp",
    [
        make_fingerprint(),
        make_fingerprint(
            cgroup_memory_limit_bytes=8 * GIB,
            gpus=(("NVIDIA H200", 150_000_000_000), ("NVIDIA H200", 150_000_000_000)),
            gpu_driver="550.54.15",
            cuda_version="12.4",
            cuda_available=True,
        ),
    ],
)
def test_attrs_round_trip(fp: Fingerprint) -> None:
    attrs = json.loads(json.dumps(fp.to_attrs()))
    assert Fingerprint.from_attrs(attrs) == fp
    assert {"memory_bytes", "cgroup_memory_limit_bytes", "usable_cpus"} <= set(attrs)


def test_from_attrs_rejects_malformed() -> None:
    attrs = make_fingerprint().to_attrs()
    del attrs["usable_cpus"]
    with pytest.raises(ValueError, match="malformed fingerprint"):
        Fingerprint.from_attrs(attrs)
