"""``python -m tuner.profiles``: the hardware profiles, the studies stored for each, this machine.

python -m tuner.profiles list [--storage URL]
python -m tuner.profiles show g4dn.xlarge
python -m tuner.profiles detect
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Sequence

from storage import default_storage_url, open_storage, sqlite_file_missing
from tuner._cli import ArgumentParser, UsageError, run_cli
from tuner.fleet import StoredStudy, stored_studies
from tuner.insight import format_table
from tuner.machine import (
    AUTO_PROFILE,
    Profile,
    auto_profile_name,
    detect_fingerprint,
    format_bytes,
    load_catalog,
    profile_mismatches,
    resolve_profile,
)

__all__ = ["PROG", "main", "parser"]


PROG = "python -m tuner.profiles"


def parser(prog: str = PROG) -> argparse.ArgumentParser:
    """The flags of ``profiles``; ``prog`` names the command in usage and error lines."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--storage",
        default=None,
        help="database URL (default: $TUNER_STORAGE, else sqlite:///tuner.db)",
    )
    common.add_argument(
        "--profiles", default=None, metavar="FILE.json", help="a JSON catalog of more profiles"
    )
    common.add_argument(
        "--format", choices=("table", "json"), default="table", help="table to read or json"
    )
    p = ArgumentParser(prog=prog, description="Hardware profiles, studies.")
    verbs = p.add_subparsers(dest="verb", required=True, parser_class=ArgumentParser)
    verbs.add_parser("list", parents=[common], help="profiles, their studies, best samples/sec")
    show = verbs.add_parser("show", parents=[common], help="one profile and its studies")
    show.add_argument("name", help="the profile's name")
    verbs.add_parser("detect", parents=[common], help="this machine and the profiles it matches")
    return p


def _studies(url: str | None) -> list[StoredStudy]:
    url = url or default_storage_url()
    if sqlite_file_missing(url):
        return []
    return stored_studies(open_storage(url, heartbeat_interval=None))


def _profile_row(profile: Profile, studies: list[StoredStudy]) -> list[object]:
    mine = [s for s in studies if s.profile_name == profile.name]
    best = max((s.best_samples_per_sec or 0.0 for s in mine), default=0.0)
    return [
        profile.name,
        profile.vcpus,
        format_bytes(profile.memory_bytes),
        profile.gpu_summary(),
        len(mine),
        sum(s.finished_trials for s in mine),
        f"{best:,.1f}" if mine and best else "-",
    ]


def _study_json(study: StoredStudy) -> dict[str, object]:
    return {
        "study": study.name,
        "profile": study.profile_name,
        "finished_trials": study.finished_trials,
        "best_trial": study.best_trial_number,
        "best_samples_per_sec": study.best_samples_per_sec,
        "best_settings": study.best_settings,
    }


def _show(profile: Profile, studies: list[StoredStudy], output: str) -> None:
    """``show NAME``: the profile, and its studies with their best trial and figure."""
    mine = [s for s in studies if s.profile_name == profile.name]
    if output == "json":
        print(
            json.dumps(
                {"profile": dataclasses.asdict(profile), "studies": [_study_json(s) for s in mine]},
                indent=2,
            )
        )
        return
    print(format_table(["field", "value"], list(dataclasses.asdict(profile).items())))
    if not mine:
        print(f"\nno study stored for {profile.name}")
        return
    rows = [
        [
            s.name,
            s.finished_trials,
            s.best_trial_number if s.best_trial_number is not None else "-",
            f"{s.best_samples_per_sec or 0:,.1f}",
        ]
        for s in mine
    ]
    headers = ["study", "finished trials", "best trial", "best samples/s"]
    print("\n" + format_table(headers, rows))


def main(argv: Sequence[str] | None = None, prog: str = PROG) -> int:
    args = parser(prog).parse_args(argv)
    catalog = load_catalog(args.profiles)
    fingerprint = detect_fingerprint()
    if args.verb == "detect":
        matches = [
            name for name, p in sorted(catalog.items()) if not profile_mismatches(p, fingerprint)
        ]
        auto = resolve_profile(AUTO_PROFILE, catalog, fingerprint).name
        own = auto_profile_name(fingerprint)
        if args.format == "json":
            facts = {"fingerprint": fingerprint.to_attrs(), "auto": auto, "fingerprint_name": own}
            print(json.dumps({**facts, "matches": matches}, indent=2))
            return 0
        print(format_table(["fact", "value"], list(fingerprint.to_attrs().items())))
        why = "the catalog profile it matches" if auto != own else "no catalog profile matches"
        print(f"\n--hardware auto (the default) names this machine {auto} ({why})")
        print(f"its fingerprint: {own}")
        print(f"matching catalog profiles: {', '.join(matches) if matches else 'none'}")
        return 0
    studies = _studies(args.storage)
    # Profiles seen only in the database (auto-named machines) are listed too.
    profiles = dict(catalog)
    for study in studies:
        if study.profile is not None:
            profiles.setdefault(study.profile.name, study.profile)
    if args.verb == "show":
        if args.name not in profiles:
            raise UsageError(f"unknown profile {args.name!r}; known: {', '.join(sorted(profiles))}")
        _show(profiles[args.name], studies, args.format)
        return 0
    if args.format == "json":
        listed = [
            {
                **dataclasses.asdict(p),
                "studies": [_study_json(s) for s in studies if s.profile_name == p.name],
            }
            for p in profiles.values()
        ]
        print(json.dumps(listed, indent=2))
        return 0
    rows = [_profile_row(profile, studies) for _, profile in sorted(profiles.items())]
    print(
        format_table(
            ["profile", "vCPUs", "memory", "GPUs", "studies", "trials", "best samples/s"], rows
        )
    )
    auto = resolve_profile(AUTO_PROFILE, catalog, fingerprint).name
    print(f"\n--hardware auto (the default) on this machine: {auto}")
    return 0


if __name__ == "__main__":
    run_cli("tuner.profiles", main)
