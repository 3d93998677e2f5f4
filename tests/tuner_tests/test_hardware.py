from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from tuner.machine import _gpu
from tuner.machine._hardware import (
    GIB,
    Fingerprint,
    Profile,
    ProfileError,
    auto_profile_name,
    cgroup_cpu_limit,
    cpu_model_name,
    detect_fingerprint,
    gpu_model_slug,
    load_catalog,
    own_cgroup_cpu_limit,
    profile_mismatches,
    resolve_profile,
    scale_workers,
    similarity,
    usable_cpu_count,
)
from tuner.machine._hardware import (
    _read_gpus as read_gpus,
)
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


def write_catalog(tmp_path: Path, content: object) -> Path:
    path = tmp_path / "profiles.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


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


def test_g4dn_xlarge_on_this_machine_lists_differences(catalog: dict[str, Profile]) -> None:
    fp = detect_fingerprint()
    mismatches = profile_mismatches(catalog["g4dn.xlarge"], fp)
    if fp.usable_cpus != 4:
        expected = f"vCPUs: profile g4dn.xlarge has 4, this machine has {fp.usable_cpus}"
        assert expected in mismatches
    if not fp.gpus:
        assert "GPUs: profile g4dn.xlarge has 1x t4, this machine has no GPU" in mismatches


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


@pytest.mark.parametrize(
    ("content", "expected"),
    [("max 100000\n", None), ("200000 100000\n", 2.0), ("150000 100000", 1.5), ("garbage", None)],
)
def test_cgroup_cpu_limit_v2(tmp_path: Path, content: str, expected: float | None) -> None:
    cpu_max = tmp_path / "cpu.max"
    cpu_max.write_text(content)
    assert cgroup_cpu_limit(cpu_max=cpu_max) == expected


@pytest.mark.parametrize(("quota", "expected"), [("-1", None), ("50000", 0.5), ("400000", 4.0)])
def test_cgroup_cpu_limit_v1(tmp_path: Path, quota: str, expected: float | None) -> None:
    (tmp_path / "cpu.cfs_quota_us").write_text(f"{quota}\n")
    (tmp_path / "cpu.cfs_period_us").write_text("100000\n")
    limit = cgroup_cpu_limit(
        cpu_max=tmp_path / "cpu.max",  # absent: v1 files are read
        cfs_quota=tmp_path / "cpu.cfs_quota_us",
        cfs_period=tmp_path / "cpu.cfs_period_us",
    )
    assert limit == expected


def test_cgroup_cpu_limit_missing_files(tmp_path: Path) -> None:
    assert cgroup_cpu_limit(tmp_path / "a", tmp_path / "b", tmp_path / "c") is None
    assert cgroup_cpu_limit() is None


def test_own_cgroup_cpu_limit_v2_parent_binds(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    leaf = root / "kubepods" / "pod1"
    leaf.mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (root / "kubepods" / "cpu.max").write_text("150000 100000\n")
    (leaf / "cpu.max").write_text("max 100000\n")
    membership = tmp_path / "self_cgroup"
    membership.write_text("0::/kubepods/pod1\n")
    assert own_cgroup_cpu_limit(membership, root) == 1.5


def test_own_cgroup_cpu_limit_v1_container_root(tmp_path: Path) -> None:
    cpu_dir = tmp_path / "cgroup" / "cpu,cpuacct"
    cpu_dir.mkdir(parents=True)
    (cpu_dir / "cpu.cfs_quota_us").write_text("300000\n")
    (cpu_dir / "cpu.cfs_period_us").write_text("100000\n")
    membership = tmp_path / "self_cgroup"
    # The host's path is not visible inside the container: its own cgroup is the mount root.
    membership.write_text("4:memory:/docker/abc\n2:cpu,cpuacct:/docker/abc\n0::/\n")
    assert own_cgroup_cpu_limit(membership, tmp_path / "cgroup") == 3.0


def test_own_cgroup_cpu_limit_without_cgroups(tmp_path: Path) -> None:
    assert own_cgroup_cpu_limit(tmp_path / "missing", tmp_path) is None


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


# --------------------------------------------------------------------------- catalog


@pytest.mark.parametrize(
    ("name", "vcpus", "memory_gib", "gpu_count", "gpu_model", "gpu_memory_gib"),
    [
        ("g4dn.xlarge", 4, 16, 1, "t4", 16),
        ("g4dn.2xlarge", 8, 32, 1, "t4", 16),
        ("g5.xlarge", 4, 16, 1, "a10g", 24),
        ("p3.2xlarge", 8, 61, 1, "v100", 16),
        ("p4d.24xlarge", 96, 1152, 8, "a100", 40),
        ("g6.xlarge", 4, 16, 1, "l4", 24),
    ],
)
def test_builtin_catalog(
    catalog: dict[str, Profile],
    name: str,
    vcpus: int,
    memory_gib: int,
    gpu_count: int,
    gpu_model: str,
    gpu_memory_gib: int,
) -> None:
    profile = catalog[name]
    assert profile.name == name
    assert profile.vcpus == vcpus
    assert profile.memory_bytes == memory_gib * GIB
    assert profile.gpu_count == gpu_count
    assert profile.gpu_model == gpu_model
    assert profile.gpu_memory_bytes == gpu_memory_gib * GIB
    assert profile.description


def test_builtin_catalog_cpu_only_profiles(catalog: dict[str, Profile]) -> None:
    cpu_only = [profile for profile in catalog.values() if profile.gpu_count == 0]
    assert cpu_only
    assert all(p.gpu_model is None and p.gpu_memory_bytes is None for p in cpu_only)
    assert all(STUDY_NAME_PART.match(name) for name in catalog)


def test_user_catalog_overlays_builtins(tmp_path: Path, catalog: dict[str, Profile]) -> None:
    path = write_catalog(
        tmp_path,
        {
            "g4dn.xlarge": {"vcpus": 4, "memory_gib": 15.5, "gpu_count": 1, "gpu_model": "T4"},
            "lab-box": {"vcpus": 32, "memory_gib": 256, "description": "the lab's workstation"},
        },
    )
    merged = load_catalog(path)
    assert merged["g4dn.xlarge"].memory_bytes == round(15.5 * GIB)
    assert merged["g4dn.xlarge"].gpu_model == "t4"
    assert merged["g4dn.xlarge"].gpu_memory_bytes is None
    assert merged["lab-box"] == Profile(
        "lab-box", 32, 256 * GIB, description="the lab's workstation"
    )
    assert merged["p4d.24xlarge"] == catalog["p4d.24xlarge"]


def test_user_catalog_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_catalog(tmp_path, {"lab-box": {"vcpus": 32, "memory_gib": 256}})
    monkeypatch.setenv("TUNER_PROFILES", str(path))
    assert "lab-box" in load_catalog()
    assert "g4dn.xlarge" in load_catalog()


def test_missing_user_catalog(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match=r"profile catalog .*nope\.json not found"):
        load_catalog(tmp_path / "nope.json")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", r"not valid JSON: .* at line 1"),
        ("[]", r"expected an object mapping profile names"),
        ({"box": 4}, r"profile 'box': expected an object"),
        ({"box": {"memory_gib": 16}}, r"profile 'box': missing field 'vcpus'"),
        ({"box": {"vcpus": 4}}, r"profile 'box': missing field 'memory_gib'"),
        ({"box": {"vcpus": -4, "memory_gib": 16}}, r"vcpus must be at least 1, got -4"),
        ({"box": {"vcpus": 0, "memory_gib": 16}}, r"vcpus must be at least 1, got 0"),
        ({"box": {"vcpus": True, "memory_gib": 16}}, r"vcpus must be an integer"),
        ({"box": {"vcpus": 4, "memory_gib": -16}}, r"memory_gib must be positive, got -16"),
        ({"box": {"vcpus": 4, "memory_gib": "16"}}, r"memory_gib must be a number"),
        ({"box": {"vcpus": 4, "memory_gib": 16, "ram_gib": 16}}, r"unknown field 'ram_gib'"),
        (
            {"box": {"vcpus": 4, "memory_gib": 16, "gpu_count": -1, "gpu_model": "t4"}},
            r"gpu_count must be at least 0",
        ),
        (
            {"box": {"vcpus": 4, "memory_gib": 16, "gpu_count": 1}},
            r"gpu_count and gpu_model must be given together",
        ),
        (
            {
                "box": {
                    "vcpus": 4,
                    "memory_gib": 16,
                    "gpu_count": 1,
                    "gpu_model": "t4",
                    "gpu_memory_gib": -1,
                }
            },
            r"gpu_memory_gib must be positive",
        ),
        ({"my box": {"vcpus": 4, "memory_gib": 16}}, r"name must be letters, digits"),
        ({"auto": {"vcpus": 4, "memory_gib": 16}}, r"not 'auto'"),
    ],
)
def test_bad_user_catalog(tmp_path: Path, content: object, message: str) -> None:
    path = write_catalog(tmp_path, content)
    with pytest.raises(ProfileError, match=message) as excinfo:
        load_catalog(path)
    text = str(excinfo.value)
    assert "\n" not in text
    assert str(path) in text
    assert isinstance(excinfo.value, ValueError)


# --------------------------------------------------------------------------- resolve and match


def test_resolve_known_and_auto(catalog: dict[str, Profile]) -> None:
    fp = make_fingerprint()
    assert resolve_profile("g5.xlarge", catalog, fp) is catalog["g5.xlarge"]
    assert resolve_profile("auto", catalog, fp) == Profile.from_fingerprint(fp)


def test_resolve_unknown_lists_known_names(catalog: dict[str, Profile]) -> None:
    with pytest.raises(ProfileError) as excinfo:
        resolve_profile("g4dn.huge", catalog, make_fingerprint())
    text = str(excinfo.value)
    assert "\n" not in text
    assert "'g4dn.huge'" in text
    assert "'auto'" in text
    assert all(name in text for name in catalog)


def test_g4dn_xlarge_on_a_two_cpu_machine(catalog: dict[str, Profile]) -> None:
    mismatches = profile_mismatches(catalog["g4dn.xlarge"], make_fingerprint())
    assert "vCPUs: profile g4dn.xlarge has 4, this machine has 2" in mismatches
    assert "GPUs: profile g4dn.xlarge has 1x t4, this machine has no GPU" in mismatches


def test_matching_cloud_machine(catalog: dict[str, Profile]) -> None:
    # A real g4dn.xlarge reports ~15.4 GiB of its advertised 16 and a T4 with 15 GiB.
    fp = make_fingerprint(
        usable_cpus=4, memory_bytes=16_480_000_000, gpus=(("Tesla T4", 15_843_721_216),)
    )
    assert profile_mismatches(catalog["g4dn.xlarge"], fp) == []
    assert profile_mismatches(catalog["g6.xlarge"], fp) == [
        "GPUs: profile g6.xlarge has 1x l4, this machine has 1x t4"
    ]


def test_gpu_count_and_cpu_profile_mismatches(catalog: dict[str, Profile]) -> None:
    two_t4 = make_fingerprint(
        usable_cpus=4, memory_bytes=16 * GIB, gpus=(("Tesla T4", 15 * GIB),) * 2
    )
    assert profile_mismatches(catalog["g4dn.xlarge"], two_t4) == [
        "GPUs: profile g4dn.xlarge has 1x t4, this machine has 2x t4"
    ]
    cpu_profile = Profile("box", vcpus=4, memory_bytes=16 * GIB)
    assert profile_mismatches(cpu_profile, two_t4) == [
        "GPUs: profile box has no GPU, this machine has 2x t4"
    ]


@pytest.mark.parametrize(
    ("usable_bytes", "matches"),
    [
        (100 * GIB, True),
        (85 * GIB, True),
        (85 * GIB - 1, False),
        (115 * GIB, True),
        (115 * GIB + 1, False),
    ],
)
def test_memory_tolerance_edges(usable_bytes: int, matches: bool) -> None:
    profile = Profile("box", vcpus=2, memory_bytes=100 * GIB)
    mismatches = profile_mismatches(profile, make_fingerprint(memory_bytes=usable_bytes))
    assert (mismatches == []) == matches
    if not matches:
        assert mismatches[0].startswith("memory: profile box has 100.0 GiB, this machine has")


def test_memory_tolerance_is_configurable_and_cgroup_capped() -> None:
    profile = Profile("box", vcpus=2, memory_bytes=16 * GIB)
    fp = make_fingerprint(memory_bytes=20 * GIB)
    assert profile_mismatches(profile, fp, memory_tolerance=0.25) == []
    assert len(profile_mismatches(profile, fp, memory_tolerance=0.1)) == 1
    capped = make_fingerprint(memory_bytes=256 * GIB, cgroup_memory_limit_bytes=16 * GIB)
    assert profile_mismatches(profile, capped) == []


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


# --------------------------------------------------------------------------- transfer


def test_similarity_ordering(catalog: dict[str, Profile]) -> None:
    g4dn = catalog["g4dn.xlarge"]
    assert similarity(g4dn, g4dn) == 1.0
    assert similarity(catalog["g4dn.2xlarge"], g4dn) > similarity(catalog["p4d.24xlarge"], g4dn)
    assert similarity(catalog["g5.xlarge"], g4dn) < similarity(catalog["g4dn.2xlarge"], g4dn)
    for a in catalog.values():
        for b in catalog.values():
            assert 0.0 <= similarity(a, b) <= 1.0
            assert similarity(a, b) == similarity(b, a)


@pytest.mark.parametrize(
    ("num_workers", "from_vcpus", "to_vcpus", "expected"),
    [
        (4, 4, 8, 8),
        (3, 4, 2, 2),  # 1.5 rounds up
        (1, 4, 2, 1),  # 0.5 rounds up
        (0, 4, 96, 0),
        (16, 2, 4, 8),  # capped at 2x the target's CPUs
        (-3, 4, 4, 0),
    ],
)
def test_scale_workers(num_workers: int, from_vcpus: int, to_vcpus: int, expected: int) -> None:
    assert scale_workers(num_workers, from_vcpus, to_vcpus) == expected


def test_scale_workers_rejects_zero_cpus() -> None:
    with pytest.raises(ValueError, match="positive"):
        scale_workers(4, 0, 4)
