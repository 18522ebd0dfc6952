#!/usr/bin/env bash
# The one command on an offline GPU node with a preinstalled PyTorch (docs/gpu.md).
#
#   .ci/gpu/run.sh
#
# Needs on the node: Python >= 3.10 with torch >= 2.11 (+ torchvision, lightning, torchmetrics, timm,
# tensorboard, scikit-learn, pytest, pytest-timeout); and, carried with this checkout, what
# .ci/gpu/prepare.sh made on the network side: .ci/gpu/cache/wheels/*.whl and .ci/gpu/cache/data.tar.gz.
#
# 1. a virtual environment layered over the node's Python (the node's packages stay visible through a
#    .pth file, whether that Python is a system one, conda or itself a venv); the carried wheels and
#    this checkout (`pip install --no-deps --no-build-isolation -e .`) go into it, nothing into the node's;
# 2. the data tar unpacked into a temporary folder, CLOC_SHARED_DATA pointing at it (without the tar the
#    GPU tier generates stand-ins in the same layout and its tables say so);
# 3. `pytest -m gpu` (tests/gpu/ and the fp16 loss checks): every shipped config at 32-true, 16-mixed and
#    bf16-mixed, the losses under autocast against float64 references, host syncs, peak memory;
# 4. `python -m benchmarks --only throughput`, where benchmarks/bench_throughput.py exists;
# 5. `python -m benchmarks --only data_path` on the GPU with resnet18 (loader vs --data.cache memory
#    --data.augment_on device inside Trainer.fit), where the data tar holds UTKFace and CIFAR-10.
#
# Every table goes to ONE folder: $OUT (as on the device tool) or $CLOC_GPU_OUT, else /tmp/cloc-gpu-out:
# run.log, gpu_configs.{md,json}, gpu_losses.{md,json}, throughput.{md,json}.
# Exit status: 0 when the tier and the benchmark passed; 1 otherwise (the log says which).
#
# On a lent machine that receives the checkout and runs one command, carry the git-ignored .ci/gpu/cache
# along (about 32 MB) and run `bash .ci/gpu/run.sh` with a limit of about 590 s; $OUT then holds 7 files.
#
# Environment: PYTHON (default python3), CLOC_GPU_CACHE (default .ci/gpu/cache), CLOC_GPU_WORK (default
# a fresh /tmp folder), CLOC_GPU_TEST_BUDGET (seconds after which the tier starts no more config runs,
# default 270; it is killed 120 s later), CLOC_GPU_BENCH_BUDGET
# (seconds for the benchmark, default 150: the full CUDA plan of the throughput benchmark), CLOC_GPU_BENCH_ARGS (e.g. --quick), CLOC_GPU_PYTEST_ARGS (extra pytest arguments, e.g. "-x" or
# "-k supcon"), CLOC_GPU_WORKERS (pytest-xdist processes sharing the device, default 2 where pytest-xdist
# is installed; 1: one process, step times of a run alone), and the tier's own switches CLOC_GPU_STEPS /
# CLOC_GPU_PRECISIONS / CLOC_GPU_SYNC.
set -uo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=.ci/gpu/prologue.sh
source .ci/gpu/prologue.sh || exit 1

stamp "the node: $(uname -srm), $("$PY" -V 2>&1) at $(command -v "$PY"); tables -> $OUT"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
"$PY" - <<'EOF' || { echo "the node's Python lacks torch/lightning: this script needs a preinstalled PyTorch"; exit 1; }
import importlib, torch
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuda available: {torch.cuda.is_available()}"
      + (f", {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ""))
for name in ("torchvision", "lightning", "torchmetrics", "timm", "tensorboard", "sklearn", "pytest", "pytest_timeout"):
    try:
        print(f"  {name} {getattr(importlib.import_module(name), '__version__', '?')}")
    except ImportError as e:
        print(f"  {name}: MISSING ({e})")
EOF

# ---------------------------------------------------------------- 1. environment, 2. data
# shellcheck source=.ci/gpu/env.sh
source "$REPO/.ci/gpu/env.sh" || exit 1

# ---------------------------------------------------------------- 3. the GPU tier
budget=${CLOC_GPU_TEST_BUDGET:-270}
workers=${CLOC_GPU_WORKERS:-2}
parallel=""
if [ "$workers" -gt 1 ] && "$VPY" -c 'import xdist' 2>/dev/null; then
  parallel="-n $workers"  # pytest-xdist: config runs side by side on the one device (peak memory stays per process)
fi
stamp "pytest -m gpu ${parallel:-(one process)} (no config run starts after $budget s; killed at $((budget + 120)) s)"
# shellcheck disable=SC2086  # word lists
CLOC_GPU_OUT=$OUT CLOC_GPU_BUDGET=$budget timeout -k 10 $((budget + 120)) \
  "$VPY" -m pytest -m gpu $parallel -q -rfEs -p no:cacheprovider --durations=15 ${CLOC_GPU_PYTEST_ARGS:-} tests
tier=$?
[ $tier -eq 124 ] && echo "pytest -m gpu was killed at $((budget + 120)) s; the tables hold the rows measured so far"

# ---------------------------------------------------------------- 4. the throughput benchmark
bench=0
if [ -f benchmarks/bench_throughput.py ]; then
  stamp "python -m benchmarks --only throughput (budget ${CLOC_GPU_BENCH_BUDGET:-150} s)"
  touch "$WORK/bench-start"
  # shellcheck disable=SC2086  # CLOC_GPU_BENCH_ARGS is a list of words (--quick for a dry run: writes no table)
  timeout -s INT -k 30 "${CLOC_GPU_BENCH_BUDGET:-150}" "$VPY" -m benchmarks --only throughput ${CLOC_GPU_BENCH_ARGS:-}
  bench=$?
  for f in benchmarks/results/throughput.md benchmarks/results/throughput.json; do
    # only a table this run wrote (not one committed or left from an earlier run)
    if [ -f "$f" ] && [ "$f" -nt "$WORK/bench-start" ]; then cp "$f" "$OUT/"; else echo "no new $f"; fi
  done
else
  stamp "benchmarks/bench_throughput.py not in this checkout: no throughput table"
fi

# ---------------------------------------------------------------- 5. the data path on the GPU (issue 39)
datapath=0
if [ -f benchmarks/bench_data_path.py ] && [ -d "${CLOC_SHARED_DATA:-/nonexistent}/utkface" ]; then
  stamp "python -m benchmarks --only data_path on the GPU, resnet18 (budget ${CLOC_GPU_DATA_PATH_BUDGET:-120} s)"
  touch "$WORK/datapath-start"
  CLOC_BENCH_ACCELERATOR=gpu CLOC_BENCH_BACKBONE=resnet18 \
    timeout -s INT -k 30 "${CLOC_GPU_DATA_PATH_BUDGET:-120}" "$VPY" -m benchmarks --only data_path ${CLOC_GPU_BENCH_ARGS:-}
  datapath=$?
  for f in benchmarks/results/data_path.md benchmarks/results/data_path.json; do
    if [ -f "$f" ] && [ "$f" -nt "$WORK/datapath-start" ]; then cp "$f" "$OUT/gpu_$(basename "$f")"; else echo "no new $f"; fi
  done
else
  stamp "no data_path benchmark (needs benchmarks/bench_data_path.py and the carried UTKFace/CIFAR-10 data)"
fi

stamp "done: pytest -m gpu exit $tier, benchmark exit $bench, data path exit $datapath; tables in $OUT:"
ls -l "$OUT"
[ $tier -eq 0 ] && [ $bench -eq 0 ] && [ $datapath -eq 0 ]
