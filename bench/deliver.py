"""Deliver what was measured: the best setting applied through each user path, measured in a
plain training loop in a fresh process, beside the study's re-measured figure.

    python -m bench.deliver                         # image and photos, short studies
    python -m bench.deliver --workloads text,storage --n-trials 14 --rounds 3

For each workload (the built-in ``image``, ``text`` and ``storage`` at the benchmarks' sizes,
and ``photos``, a user-style file workload: JPEG decode + PIL augmentation in ``__getitem__``,
a small CNN step; see ``bench/photos_workload.py``) it runs a short study with
``python -m tuner.study`` on a fresh SQLite file, then measures, in rounds (the order rotated
each round, every measurement in a new interpreter):

* ``tuner.loader``: ``tuner.loader(workload=..., objective=..., storage=...)``;
* ``--format python``: the snippet ``python -m tuner.best`` prints, executed as pasted;
* ``--format json``: the JSON file read as the README says (``DataLoader(ds,
  **setting["dataloader"])``, ``torch.set_num_threads(setting["torch_num_threads"])``, the
  knobs through the workload's ``configure``, a token budget through the workload's batch
  sampler);
* ``kwargs only``: for reference, what ``--format json`` delivered before (the DataLoader
  arguments alone, torch's default threads, the workload's default knobs);
* ``tuner measure``: the tuner's own measurement of the setting now (a trial child), so a
  machine that got busier or quieter since the study shows as such.

The plain loop is a training loop as users write it: ``for batch in loader``, move to the
device, the workload's step, the optimizer step, a new iterator at each epoch end; warm-up,
then samples over a fixed window. Ratios are against the study's re-measured figure (the one
``tuner.best`` reports) and against ``tuner measure`` of the same rounds. Goal: every path at
least 90% of the study's figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench._harness import (
    ROOT,
    USER_WORKLOADS,
    Harness,
    cli_study,
    describe,
    machine_summary,
    markdown_table,
    output_dir,
    print_machine,
    run_module,
    write_json,
)
from tuner.insight import BestSetting

GOAL = 0.90

WORKLOADS = USER_WORKLOADS
"""name -> (objective spec, workload options): the built-in workloads at the benchmarks' sizes,
``photos`` and ``off_cpu`` (``bench._harness.USER_WORKLOADS``)."""

PATHS = ("tuner.loader", "--format python", "--format json", "kwargs only", "tuner measure")

# What each path's fresh process runs to get ``loader`` (and ``workload``, whose step trains).
_BUILD = {
    "tuner.loader": """
        import tuner
        from objectives import load_workload
        workload = load_workload(OBJECTIVE, OPTIONS)
        loader = tuner.loader(workload=workload, objective=OBJECTIVE, storage=STORAGE)
    """,
    "--format python": """
        from objectives import load_workload
        workload = load_workload(OBJECTIVE, OPTIONS)
        dataset = workload.dataset  # your dataset; the snippet replaces it when it has knobs
        exec(open(SNIPPET).read())
    """,
    "--format json": """
        import json
        import torch
        from torch.utils.data import DataLoader
        from bench.deliver import sampling
        from objectives import load_workload
        with open(SETTING) as f:
            setting = json.load(f)
        torch.set_num_threads(setting["torch_num_threads"])
        workload = load_workload(setting["objective"], setting["workload_options"])
        workload = workload.with_knobs(setting["knobs"])
        loader = DataLoader(
            workload.dataset, collate_fn=workload.collate_fn, **setting["dataloader"],
            **sampling(workload, setting),
        )
    """,
    "kwargs only": """
        import json
        from torch.utils.data import DataLoader
        from bench.deliver import sampling
        from objectives import load_workload
        with open(SETTING) as f:
            setting = json.load(f)
        workload = load_workload(OBJECTIVE, OPTIONS)
        loader = DataLoader(
            workload.dataset, collate_fn=workload.collate_fn, **setting["dataloader"],
            **sampling(workload, setting),
        )
    """,
}


def sampling(workload: Any, setting: dict[str, Any]) -> dict[str, Any]:
    """How the README's JSON recipe orders samples: shuffled batches of ``batch_size``, or, for
    a tuned token budget (``batch_param`` other than ``batch_size``), the workload's batch
    sampler given the budget (``batch_sampler=``)."""
    if setting["batch_param"] == "batch_size":
        return {"shuffle": True}
    return {"batch_sampler": workload.batch_sampler(workload.dataset, setting["batch"], 0)}


def _measure_in_fresh_process(path: str, context: dict[str, Any], args: argparse.Namespace) -> Any:
    """Run one path's build code and the plain loop in a new interpreter; its result."""
    header = "".join(f"{name} = {value!r}\n" for name, value in context.items())
    code = (
        header
        + textwrap.dedent(_BUILD[path])
        + "from bench._harness import plain_loop\nimport json as _json\n"
        + f"print(_json.dumps(plain_loop(loader, workload, {args.warmup}, {args.window})))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    if result.returncode != 0:
        print(f"{path}: failed: {result.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return None
    return json.loads(result.stdout.strip().splitlines()[-1])


def _study(name: str, storage: str, args: argparse.Namespace) -> BestSetting:
    """A short study as a user runs it; its best as ``tuner.best`` reports it."""
    import tuner

    objective, options = WORKLOADS[name]
    flags = ["--n-trials", str(args.n_trials), "--trial-seconds", str(args.trial_seconds)]
    wall_s, _ = cli_study(objective, options, storage, flags)
    print(f"{name}: study of {args.n_trials} trials in {wall_s:.0f} s")
    return tuner.best_setting("auto", objective=objective, storage=storage)


def _harness(name: str, storage: str, args: argparse.Namespace) -> Harness:
    from tuner.run import StudyConfig, prepare

    objective, options = WORKLOADS[name]
    config = StudyConfig(
        hardware="auto",
        objective=objective,
        objective_options=dict(options),
        storage=storage,
        trial_seconds=args.trial_seconds,
        progress=False,
    )
    return Harness(prepare(config))


def deliver(name: str, folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The study, then every path measured ``args.rounds`` times, rotated; the figures."""
    storage = f"sqlite:///{folder / f'{name}.db'}"
    best = _study(name, storage, args)
    objective, options = WORKLOADS[name]
    snippet, setting = folder / f"{name}-snippet.py", folder / f"{name}-best.json"
    common = ["--hardware", "auto", "--objective", objective, "--storage", storage]
    snippet.write_text(run_module("tuner.best", *common, "--format", "python").stdout)
    setting.write_text(run_module("tuner.best", *common, "--format", "json").stdout)
    context = {
        "OBJECTIVE": objective,
        "OPTIONS": dict(options),
        "STORAGE": storage,
        "SNIPPET": str(snippet),
        "SETTING": str(setting),
    }
    harness = _harness(name, storage, args)
    runs: dict[str, list[dict[str, Any]]] = {path: [] for path in PATHS}
    for round_number in range(args.rounds):
        shift = round_number % len(PATHS)
        for path in PATHS[shift:] + PATHS[:shift]:
            if path == "tuner measure":
                value = harness.measure(best.settings)
                got = None if value is None else {"samples_per_sec": value}
            else:
                got = _measure_in_fresh_process(path, context, args)
            if got is not None:
                runs[path].append(got)
    return {
        "best": best.to_json(),
        "setting": describe(best.settings, best.batch_param),
        "runs": runs,
    }


def _table(name: str, result: dict[str, Any]) -> str:
    best = result["best"]
    study = best["samples_per_sec"]
    now = [run["samples_per_sec"] for run in result["runs"]["tuner measure"]]
    now_median = statistics.median(now) if now else None
    rows = []
    for path, runs in result["runs"].items():
        values = [run["samples_per_sec"] for run in runs]
        if not values:
            rows.append([path, "-", "-", "-", "-", "-"])
            continue
        median = statistics.median(values)
        threads = runs[0].get("torch_num_threads", best["torch_num_threads"])
        rows.append(
            [
                path,
                f"{median:,.1f}",
                " / ".join(f"{v:,.0f}" for v in values),
                threads,
                f"{median / study:.2f}",
                f"{median / now_median:.2f}" if now_median else "-",
            ]
        )
    headers = ["path", "samples/s (median)", "rounds", "threads", "vs study", "vs tuner now"]
    lines = [
        f"### {name}: trial {best['trial']} of {best['finished_trials']}, "
        f"`{result['setting']}`, study re-measured {study:,.1f} samples/s",
        "",
        markdown_table(headers, rows),
    ]
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.deliver", description=__doc__.split("\n")[0])
    p.add_argument(
        "--workloads", default="image,photos", help=f"comma-separated: {', '.join(WORKLOADS)}"
    )
    p.add_argument("--n-trials", type=int, default=12)
    p.add_argument("--trial-seconds", type=float, default=3.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup", type=float, default=1.5, help="plain loop warm-up, seconds")
    p.add_argument("--window", type=float, default=5.0, help="plain loop window, seconds")
    p.add_argument("--out", default=None, help="folder for the databases and results")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    names = [name.strip() for name in args.workloads.split(",") if name.strip()]
    unknown = [name for name in names if name not in WORKLOADS]
    if unknown:
        print(f"unknown workload {unknown[0]!r}; known: {', '.join(WORKLOADS)}", file=sys.stderr)
        return 2
    folder = output_dir(args.out, "deliver")
    machine = machine_summary()
    print_machine(machine)
    print(f"results in {folder}")
    if "photos" in names:
        from bench.photos_workload import make_photos

        make_photos()
    results = {}
    for name in names:
        results[name] = deliver(name, folder, args)
        print("\n" + _table(name, results[name]) + "\n", flush=True)
    machine_after = machine_summary()
    print(f"load average after: {machine_after['load_average']}")
    write_json(folder / "deliver.json", {"machine": machine, "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
