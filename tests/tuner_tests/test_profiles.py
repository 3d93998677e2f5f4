"""The profile catalog, matching a machine to a profile, and warm-start similarity."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.tuner_tests.test_fingerprint import STUDY_NAME_PART, make_fingerprint
from tuner.machine._fingerprint import GIB
from tuner.machine._profiles import (
    Profile,
    ProfileError,
    load_catalog,
    matching_profile,
    profile_mismatches,
    resolve_profile,
    scale_workers,
    similarity,
)


@pytest.fixture
def catalog(monkeypatch: pytest.MonkeyPatch) -> dict[str, Profile]:
    monkeypatch.delenv("TUNER_PROFILES", raising=False)
    return load_catalog()


def write_catalog(tmp_path: Path, content: object) -> Path:
    path = tmp_path / "profiles.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


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


G4DN_XLARGE_FACTS = {"usable_cpus": 4, "gpus": (("Tesla T4", 15_843_721_216),)}
"""A g4dn.xlarge as it reports itself (with its RAM given per test: the profile says 16 GiB)."""


def test_auto_on_a_machine_that_matches_a_profile_names_that_profile(
    catalog: dict[str, Profile],
) -> None:
    fp = make_fingerprint(**G4DN_XLARGE_FACTS, memory_bytes=16_480_000_000)
    assert matching_profile(catalog, fp) is catalog["g4dn.xlarge"]
    assert resolve_profile("auto", catalog, fp) is catalog["g4dn.xlarge"]


@pytest.mark.parametrize("ram_share", [0.8, 1.2])
def test_auto_on_a_machine_20_percent_off_in_ram_names_its_fingerprint(
    catalog: dict[str, Profile], ram_share: float
) -> None:
    fp = make_fingerprint(**G4DN_XLARGE_FACTS, memory_bytes=round(ram_share * 16 * GIB))
    assert matching_profile(catalog, fp) is None
    auto = resolve_profile("auto", catalog, fp)
    assert auto == Profile.from_fingerprint(fp) and auto.name.startswith("local-4cpu-")


def test_auto_needs_the_same_gpu_model_and_count(catalog: dict[str, Profile]) -> None:
    two_t4 = make_fingerprint(**{**G4DN_XLARGE_FACTS, "gpus": (("Tesla T4", 15 * GIB),) * 2})
    assert resolve_profile("auto", catalog, two_t4).name.startswith("local-")
    l4 = make_fingerprint(usable_cpus=4, memory_bytes=16 * GIB, gpus=(("NVIDIA L4", 23 * GIB),))
    assert resolve_profile("auto", catalog, l4) is catalog["g6.xlarge"]


def test_of_several_matching_profiles_auto_takes_the_nearest_ram() -> None:
    near, far = Profile("near", 4, 16 * GIB), Profile("far", 4, 18 * GIB)
    fp = make_fingerprint(usable_cpus=4, memory_bytes=16 * GIB)
    assert matching_profile({"far": far, "near": near}, fp) is near
    twin = Profile("a-twin", 4, 16 * GIB)
    assert matching_profile({"near": near, "a-twin": twin}, fp) is twin  # then by name


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
