#!/usr/bin/env bash
# The GPU memory guard on a real CUDA machine: a study whose large batches cross a small
# --gpu-memory-limit, then the trials' verdicts and tuner.best.
#
#   bash bench/gpu_check.sh                  # from the repository root
#   OUT_DIR=/tmp/gpu-run PYTHON=python3.11 bash bench/gpu_check.sh
#
# Needs a Python whose torch has CUDA (checked first). The project is installed into a venv in
# $OUT_DIR that sees that Python's packages (--system-site-packages), so torch is not reinstalled;
# without network access, the install falls back to --no-deps (the dependencies must then be
# importable already). The whole run is bounded to 7m45s.
set -euo pipefail

LIMIT_S=${GPU_CHECK_LIMIT_S:-465}
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

echo "gpu_check: study with --gpu-memory-limit $GPU_LIMIT"
set +e
timeout 330 "$PY" -m tuner.study --hardware auto --device cuda --objective image \
    --n-trials 12 --trial-seconds 2 --gpu-memory-limit "$GPU_LIMIT" --no-progress \
    --storage "$STORAGE" ${EXTRA_STUDY_FLAGS:-}
study_rc=$?
set -e
echo "gpu_check: tuner.study exited $study_rc"

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
echo "gpu_check: tuner.best"
timeout 60 "$PY" -m tuner.best --hardware auto --storage "$STORAGE" || echo "tuner.best exited $?"
exit "$study_rc"
