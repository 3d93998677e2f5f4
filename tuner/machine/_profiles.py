"""Named hardware profiles: the catalog, and whether this machine may join a profile's study.

The built-in catalog (``profiles.json``) overlaid by a user's (:func:`load_catalog`), ``--hardware
NAME`` resolved against it (:func:`resolve_profile`), this machine's fingerprint checked against
the profile (:func:`profile_mismatches`) so a machine never writes into another profile's study,
and how alike two profiles are for warm starts (:func:`similarity`, :func:`scale_workers`).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from tuner.machine._fingerprint import (
    GIB,
    Fingerprint,
    auto_profile_name,
    gpu_counts,
    gpu_model_slug,
)

__all__ = [
    "AUTO_PROFILE",
    "PROFILES_ENV",
    "Profile",
    "ProfileError",
    "load_catalog",
    "matching_profile",
    "profile_mismatches",
    "resolve_profile",
    "scale_workers",
    "similarity",
]

AUTO_PROFILE = "auto"
PROFILES_ENV = "TUNER_PROFILES"

# Optuna study names travel through URLs, file names and SQL; keep them plain.
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.-]*$")

_REQUIRED_FIELDS = frozenset({"vcpus", "memory_gib"})
_OPTIONAL_FIELDS = frozenset({"gpu_count", "gpu_model", "gpu_memory_gib", "description"})


class ProfileError(ValueError):
    """A hardware profile or catalog is unusable; the message is one line for the CLI."""


@dataclass(frozen=True)
class Profile:
    """A named kind of machine; every machine of one profile shares its studies."""

    name: str
    vcpus: int
    memory_bytes: int
    gpu_count: int = 0
    gpu_model: str | None = None
    gpu_memory_bytes: int | None = None
    description: str = ""

    @classmethod
    def from_fingerprint(cls, fp: Fingerprint) -> Profile:
        """The 'auto' profile: a function of :func:`auto_profile_name`'s parts only,
        so every machine with the same auto name gets the same profile."""
        counts = gpu_counts(fp)
        gpu_model = counts.most_common(1)[0][0] if counts else None
        gpu_memory = min(size for _, size in fp.gpus) if fp.gpus else None
        return cls(
            name=auto_profile_name(fp),
            vcpus=fp.usable_cpus,
            memory_bytes=(fp.usable_memory_bytes // GIB) * GIB,
            gpu_count=len(fp.gpus),
            gpu_model=gpu_model,
            gpu_memory_bytes=gpu_memory,
            description=f"auto-detected: {fp.cpu_model}",
        )

    def gpu_summary(self) -> str:
        return f"{self.gpu_count}x {self.gpu_model}" if self.gpu_count else "no GPU"


def load_catalog(user_file: str | Path | None = None) -> dict[str, Profile]:
    """Built-in profiles, overlaid by a user catalog (argument, else ``$TUNER_PROFILES``).

    A user entry with a built-in's name replaces it. Raises :class:`ProfileError`
    with a one-line message on any problem in either file.
    """
    builtin = resources.files("tuner.machine").joinpath("profiles.json").read_text()
    catalog = _parse_catalog(builtin, "built-in profiles.json")
    user_path = user_file if user_file is not None else os.environ.get(PROFILES_ENV) or None
    if user_path is not None:
        catalog.update(_parse_catalog(_read_catalog_file(Path(user_path)), str(user_path)))
    return catalog


def _read_catalog_file(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        raise ProfileError(f"profile catalog {path} not found") from None
    except OSError as exc:
        raise ProfileError(f"profile catalog {path} cannot be read: {exc.strerror}") from None


def _parse_catalog(text: str, source: str) -> dict[str, Profile]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProfileError(
            f"{source}: not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    if not isinstance(data, dict):
        raise ProfileError(f"{source}: expected an object mapping profile names to entries")
    return {name: _parse_entry(name, entry, source) for name, entry in data.items()}


def _parse_entry(name: str, entry: object, source: str) -> Profile:
    where = f"{source}: profile {name!r}"
    if not _SAFE_NAME.match(name) or name == AUTO_PROFILE:
        raise ProfileError(f"{where}: name must be letters, digits, '-', '.' and not 'auto'")
    if not isinstance(entry, dict):
        raise ProfileError(f"{where}: expected an object")
    unknown = sorted(set(entry) - _REQUIRED_FIELDS - _OPTIONAL_FIELDS)
    if unknown:
        raise ProfileError(f"{where}: unknown field {unknown[0]!r}")
    missing = sorted(_REQUIRED_FIELDS - set(entry))
    if missing:
        raise ProfileError(f"{where}: missing field {missing[0]!r}")
    gpu_count = _int_field(entry, "gpu_count", where, minimum=0, default=0)
    gpu_model = _gpu_model_field(entry, where)
    if (gpu_count > 0) != (gpu_model is not None):
        raise ProfileError(f"{where}: gpu_count and gpu_model must be given together")
    gpu_memory_gib = _optional_number_field(entry, "gpu_memory_gib", where)
    return Profile(
        name=name,
        vcpus=_int_field(entry, "vcpus", where, minimum=1),
        memory_bytes=round(_number_field(entry, "memory_gib", where) * GIB),
        gpu_count=gpu_count,
        gpu_model=gpu_model,
        gpu_memory_bytes=None if gpu_memory_gib is None else round(gpu_memory_gib * GIB),
        description=_str_field(entry, "description", where),
    )


def _int_field(
    entry: Mapping[str, Any], field: str, where: str, *, minimum: int, default: int | None = None
) -> int:
    value = entry.get(field, default)
    # bool is an int in Python; `"vcpus": true` is a typo, not 1.
    if not isinstance(value, int) or isinstance(value, bool):
        raise ProfileError(f"{where}: {field} must be an integer, got {value!r}")
    if value < minimum:
        raise ProfileError(f"{where}: {field} must be at least {minimum}, got {value}")
    return value


def _number_field(entry: Mapping[str, Any], field: str, where: str) -> float:
    value = entry.get(field)
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise ProfileError(f"{where}: {field} must be a number, got {value!r}")
    if value <= 0:
        raise ProfileError(f"{where}: {field} must be positive, got {value}")
    return float(value)


def _optional_number_field(entry: Mapping[str, Any], field: str, where: str) -> float | None:
    if entry.get(field) is None:
        return None
    return _number_field(entry, field, where)


def _gpu_model_field(entry: Mapping[str, Any], where: str) -> str | None:
    value = entry.get("gpu_model")
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ProfileError(f"{where}: gpu_model must be a non-empty string, got {value!r}")
    # Accept 'T4' or 'NVIDIA T4' too; matching is by slug.
    return gpu_model_slug(value)


def _str_field(entry: Mapping[str, Any], field: str, where: str) -> str:
    value = entry.get(field, "")
    if not isinstance(value, str):
        raise ProfileError(f"{where}: {field} must be a string, got {value!r}")
    return value


def resolve_profile(name: str, catalog: Mapping[str, Profile], fp: Fingerprint) -> Profile:
    """The profile for ``--hardware NAME``.

    ``auto`` is the catalog profile this machine matches (:func:`matching_profile`), so a study
    run as ``--hardware g4dn.xlarge`` is the one ``auto`` finds on such a machine; else this
    machine's own (:meth:`Profile.from_fingerprint`, named ``local-...``). Any other name must
    be in ``catalog`` (:class:`ProfileError`).
    """
    if name == AUTO_PROFILE:
        return matching_profile(catalog, fp) or Profile.from_fingerprint(fp)
    try:
        return catalog[name]
    except KeyError:
        known = ", ".join(sorted(catalog))
        raise ProfileError(
            f"unknown hardware profile {name!r}; known profiles: {known}; "
            f"or use 'auto' to detect this machine"
        ) from None


def matching_profile(catalog: Mapping[str, Profile], fp: Fingerprint) -> Profile | None:
    """The catalog profile this machine may join (:func:`profile_mismatches` finds nothing:
    vCPUs equal, RAM within 15%, the same GPU models and counts), or None. Where several
    match, the one whose RAM is nearest this machine's (then the first by name)."""
    matches = [profile for profile in catalog.values() if not profile_mismatches(profile, fp)]
    if not matches:
        return None
    return min(matches, key=lambda p: (abs(p.memory_bytes - fp.usable_memory_bytes), p.name))


def profile_mismatches(
    profile: Profile, fp: Fingerprint, memory_tolerance: float = 0.15
) -> list[str]:
    """How this machine differs from ``profile``; empty means it may join the profile's study.

    RAM is compared with a relative tolerance because a cloud machine reports a
    little less than its advertised size (kernel and firmware reservations).
    """
    return [
        text
        for text in (
            _cpu_mismatch(profile, fp),
            _memory_mismatch(profile, fp, memory_tolerance),
            _gpu_mismatch(profile, fp),
        )
        if text is not None
    ]


def _cpu_mismatch(profile: Profile, fp: Fingerprint) -> str | None:
    if fp.usable_cpus == profile.vcpus:
        return None
    return f"vCPUs: profile {profile.name} has {profile.vcpus}, this machine has {fp.usable_cpus}"


def _memory_mismatch(profile: Profile, fp: Fingerprint, tolerance: float) -> str | None:
    usable = fp.usable_memory_bytes
    if abs(usable - profile.memory_bytes) <= tolerance * profile.memory_bytes:
        return None
    return (
        f"memory: profile {profile.name} has {profile.memory_bytes / GIB:.1f} GiB, "
        f"this machine has {usable / GIB:.1f} GiB (tolerance ±{tolerance:.0%})"
    )


def _gpu_mismatch(profile: Profile, fp: Fingerprint) -> str | None:
    machine = gpu_counts(fp)
    expected = Counter({profile.gpu_model: profile.gpu_count}) if profile.gpu_count else Counter()
    if machine == expected:
        return None
    has = ", ".join(f"{machine[model]}x {model}" for model in sorted(machine)) or "no GPU"
    return f"GPUs: profile {profile.name} has {profile.gpu_summary()}, this machine has {has}"


# --------------------------------------------------------------------------- transfer


def _ratio(a: float, b: float) -> float:
    """min/max in [0, 1]; two zeros are identical."""
    if a == b:
        return 1.0
    return min(a, b) / max(a, b)


def similarity(a: Profile, b: Profile) -> float:
    """How alike two profiles are, in [0, 1], for choosing warm-start studies.

    The GPU model weighs most (it decides whether pinned memory and batch sizes
    carry over), then vCPUs (they bound num_workers), then RAM.
    """
    same_gpu = a.gpu_model == b.gpu_model
    gpu_score = _ratio(a.gpu_count, b.gpu_count) if same_gpu else 0.0
    return (
        0.5 * gpu_score
        + 0.3 * _ratio(a.vcpus, b.vcpus)
        + 0.2 * _ratio(a.memory_bytes, b.memory_bytes)
    )


def scale_workers(num_workers: int, from_vcpus: int, to_vcpus: int) -> int:
    """num_workers tuned on ``from_vcpus`` CPUs, scaled to ``to_vcpus`` CPUs.

    Capped at twice the CPUs: beyond that workers only add memory and contention.
    """
    if from_vcpus < 1 or to_vcpus < 1:
        raise ValueError(f"vCPU counts must be positive, got {from_vcpus} and {to_vcpus}")
    # Round half up, not to even, so 1.5 workers -> 2 regardless of parity.
    scaled = math.floor(num_workers * to_vcpus / from_vcpus + 0.5)
    return max(0, min(scaled, 2 * to_vcpus))
