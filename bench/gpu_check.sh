#!/usr/bin/env bash
# The tuner on a real CUDA machine, four checks in turn:
#   1. the GPU memory guard: a 1-rank study (--nproc-per-node 1) of the image workload, which
#      hands its model over, whose large batches cross a small --gpu-memory-limit; the trials'
#      verdicts;
#   2. the model under DDP in the ranks' path: one measurement in min(2, GPUs) real rank
#      processes (NCCL, DistributedDataParallel with device_ids, cuda:LOCAL_RANK), each rank
#      saying what it trained;
#   3. CUDA_VISIBLE_DEVICES remapped (to the last GPU where there are several, by index and by
#      GPU- UUID): the GPU the study's guard reads is the one the process's cuda:0 fills;
#   4. tuner.best.
#
#   bash bench/gpu_check.sh                  # from the repository root
#   OUT_DIR=/tmp/gpu-run PYTHON=python3.11 bash bench/gpu_check.sh
#
# Needs a Python whose torch has CUDA (checked first: without one it stops with exit 2). The
# project is installed into a venv in $OUT_DIR that sees that Python's packages
# (--system-site-packages), so torch is not reinstalled; without network access, the install
# falls back to --no-deps (the dependencies must then be importable already). The whole run is
# bounded to 9m30s; it exits non-zero when any check failed, and says which.
set -euo pipefail

LIMIT_S=${GPU_CHECK_LIMIT_S:-570}
if [[ -z "${GPU_CHECK_BOUNDED:-}" ]]; then
    export GPU_CHECK_BOUNDED=1
    exec timeout --kill-after=10 "$LIMIT_S" bash "$0" "$@"
fi

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
PYTHON=${PYTHON:-python3}
OUT_DIR=${OUT_DIR:-$(mktemp -d -t gpu-check.XXXXXX)}
mkdir -p "$OUT_DIR"
DB="$OUT_DIR/gpu.db"
STORAGE="sqlite:///$DB"
GPU_LIMIT=${GPU_LIMIT:-2GiB}
echo "gpu_check: output in $OUT_DIR"

if ! "$PYTHON" -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
    echo "gpu_check: $PYTHON has no torch with a usable CUDA device" >&2
    echo "  (install a CUDA build of torch, or set PYTHON=/path/to/python that has one)" >&2
    exit 2
fi
"$PYTHON" -c 'import torch; print("gpu_check: torch", torch.__version__, "on",
    torch.cuda.get_device_name(0))'

VENV="$OUT_DIR/venv"
if [[ ! -x "$VENV/bin/python" ]]; then
    "$PYTHON" -m venv --system-site-packages "$VENV"
fi
PY="$VENV/bin/python"
if ! "$PY" -m pip install --quiet --disable-pip-version-check -e "$ROOT" 2>"$OUT_DIR/pip.log"; then
    echo "gpu_check: pip install -e . failed (see $OUT_DIR/pip.log); trying --no-deps" >&2
    "$PY" -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation \
        -e "$ROOT"
fi
"$PY" -c 'import torch, optuna, psutil, pynvml, tuner; assert torch.cuda.is_available()'

failed=()

echo "gpu_check: 1. a 1-rank study with --gpu-memory-limit $GPU_LIMIT"
set +e
timeout 300 "$PY" -m tuner.study --hardware auto --device cuda --objective image \
    --nproc-per-node 1 --n-trials 12 --trial-seconds 2 --gpu-memory-limit "$GPU_LIMIT" \
    --no-progress --storage "$STORAGE" ${EXTRA_STUDY_FLAGS:-}
study_rc=$?
set -e
echo "gpu_check: tuner.study exited $study_rc"
[[ $study_rc -eq 0 ]] || failed+=("1-rank study (exit $study_rc)")

"$PY" - "$STORAGE" <<'EOF'
import sys

import optuna
from optuna.trial import TrialState

optuna.logging.set_verbosity(optuna.logging.WARNING)
storage = sys.argv[1]
for summary in optuna.get_all_study_summaries(storage):
    study = optuna.load_study(study_name=summary.study_name, storage=storage)
    print(f"\n{study.study_name}: max_batch_size (probe) = {study.user_attrs.get('max_batch_size')}")
    print(f"{'#':>3}  {'state':<8}  {'batch':>5}  {'workers':>7}  {'pruned_reason':<22}"
          f"  {'peak_gpu_MiB':>12}  {'samples/s':>10}")
    gpu_pruned, completed = [], []
    for trial in study.get_trials(deepcopy=False):
        attrs = trial.user_attrs
        settings = attrs.get("settings", {})
        batch = settings.get("batch")
        peak = attrs.get("peak_gpu_memory_bytes")
        reason = attrs.get("pruned_reason", "")
        done = trial.state == TrialState.COMPLETE and trial.value is not None
        value = f"{trial.value:,.0f}" if done else "-"
        print(f"{trial.number:>3}  {trial.state.name:<8}  {batch!s:>5}"
              f"  {settings.get('num_workers')!s:>7}  {reason:<22}"
              f"  {'-' if peak is None else f'{peak / 2**20:,.0f}':>12}  {value:>10}")
        if reason in ("memory_guard: gpu", "cuda_oom"):
            gpu_pruned.append(batch)
        elif trial.state == TrialState.COMPLETE:
            completed.append(batch)
    if gpu_pruned and completed and min(completed) < min(gpu_pruned):
        print(f"GPU wall seen: batches {sorted(set(gpu_pruned))} pruned for GPU memory, "
              f"smaller batches {sorted(set(completed))} completed")
    elif gpu_pruned:
        print(f"GPU prunes {sorted(set(gpu_pruned))}, but no smaller batch completed")
    else:
        print("no trial was pruned for GPU memory (the batch probe may have capped the batch "
              "below the limit: try EXTRA_STUDY_FLAGS=--no-probe-batch)")
EOF

echo
echo "gpu_check: 2. the model under DDP in the ranks' path"
if ! timeout 90 "$PY" - <<'EOF'
import multiprocessing
import sys

import torch
import torch.distributed as dist

from objectives import load_workload
from tuner.search import LoaderSettings
from tuner.trial import Job, Mode
from tuner.trial._child import _measure_in
from tuner.trial._protocol import Failure, Result
from tuner.trial._ranks import run_ranks

ranks = min(2, torch.cuda.device_count())  # asks NVML: CUDA stays uninitialised, ranks fork


def measure_rank(conn, workload, job, device, before_window, stepping):
    """The trial child's measurement, saying at the ranks' barrier what this rank trains."""

    def meet():
        module = stepping.__self__.module  # the rank's RankModel: its model under DDP
        print(f"gpu_check: rank {dist.get_rank()} of {dist.get_world_size()} "
              f"({dist.get_backend()}): {type(module).__name__} on {device}, "
              f"device_ids {getattr(module, 'device_ids', None)}", flush=True)
        before_window()

    _measure_in(conn, workload, job, device, meet, stepping)


settings = LoaderSettings(batch=64, num_workers=2, prefetch_factor=2, pin_memory=True,
                          persistent_workers=True)
job = Job(Mode.MEASURE, "image", {}, settings, "cuda:0", 3.0, 1.0, nproc_per_node=ranks)
receiver, sender = multiprocessing.Pipe(duplex=False)
run_ranks(sender, measure_rank, load_workload("image"), job)
outcome = None
while receiver.poll(0):
    message = receiver.recv()
    if isinstance(message, Result | Failure):
        outcome = message
if not isinstance(outcome, Result):
    sys.exit(f"gpu_check: {ranks} DDP rank(s) failed: {outcome}")
rates = ", ".join(f"{rate:,.0f}" for rate in outcome.attrs["rank_samples_per_sec"])
print(f"gpu_check: {ranks} DDP rank(s): node {outcome.attrs['samples_per_sec']:,.0f} samples/s "
      f"(ranks {rates})")
EOF
then
    failed+=("DDP ranks")
fi

echo
echo "gpu_check: 3. CUDA_VISIBLE_DEVICES remapped: the guard reads the GPU cuda:0 fills"
mapfile -t remaps < <("$PY" -c '
from tuner import machine
devices = machine.open_gpu_reader().devices()
last = devices[-1]  # with several GPUs, cuda:0 is then not NVML device 0
print(last.index)
if last.uuid:
    print(last.uuid)
')
[[ ${#remaps[@]} -gt 0 ]] || failed+=("CUDA_VISIBLE_DEVICES remap (NVML lists no GPU)")
for visible in "${remaps[@]}"; do
    if ! CUDA_VISIBLE_DEVICES="$visible" OUT_DIR="$OUT_DIR" timeout 90 "$PY" - <<'EOF'
import contextlib
import os
import sys

import torch

from tuner import machine
from tuner.run import StudyConfig, prepare

visible = os.environ["CUDA_VISIBLE_DEVICES"]
GiB = 2**30
with contextlib.closing(machine.open_gpu_reader()) as reader:
    devices = reader.devices()
    expected = next(d.index for d in devices if visible in (str(d.index), d.uuid))
    storage = f"sqlite:///{os.environ['OUT_DIR']}/remap.db"
    guarded = prepare(StudyConfig(objective="storage", device="cuda", storage=storage)).gpu_indices

    def used() -> dict[int, int]:
        return {r.index: r.memory_used_bytes for r in reader.read()}

    before = used()
    block = torch.ones(GiB, dtype=torch.uint8, device="cuda:0")  # CUDA starts here
    torch.cuda.synchronize()
    grew = {index: value - before.get(index, 0) for index, value in used().items()}
    by_pci = machine.nvml_index_of("cuda:0", devices)  # CUDA running: by PCI address
    print(f"gpu_check: CUDA_VISIBLE_DEVICES={visible}: guard reads NVML {guarded}, "
          f"cuda:0 is NVML {by_pci} by PCI address, expected {expected}; MiB grown per NVML "
          f"device: { {i: g // 2**20 for i, g in grew.items()} }")
    others = [g for i, g in grew.items() if i != expected]
    if guarded != (expected,) or by_pci != expected or grew.get(expected, 0) < 0.9 * GiB:
        sys.exit(f"gpu_check: CUDA_VISIBLE_DEVICES={visible}: the guard reads the wrong GPU")
    if any(g >= 0.5 * GiB for g in others):
        sys.exit(f"gpu_check: CUDA_VISIBLE_DEVICES={visible}: another GPU filled as well")
EOF
    then
        failed+=("CUDA_VISIBLE_DEVICES=$visible")
    fi
done

echo
echo "gpu_check: 4. tuner.best"
timeout 60 "$PY" -m tuner.best --hardware auto --storage "$STORAGE" || echo "tuner.best exited $?"
if [[ ${#failed[@]} -gt 0 ]]; then
    echo "gpu_check: FAILED: ${failed[*]}" >&2
    exit 1
fi
echo "gpu_check: every check passed"
