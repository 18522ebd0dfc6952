# Sourced first by .ci/gpu/run.sh and .ci/gpu/experiments.sh, in the checkout's root: the folders
# (REPO, OUT: where everything that comes back goes, CACHE: what prepare.sh made, WORK: scratch), the
# node's Python (PY), the log ($OUT/run.log gets everything printed) and `stamp` (seconds since the start).
REPO=$PWD
OUT=${OUT:-${CLOC_GPU_OUT:-/tmp/cloc-gpu-out}}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
CACHE=${CLOC_GPU_CACHE:-$REPO/.ci/gpu/cache}
WORK=${CLOC_GPU_WORK:-$(mktemp -d /tmp/cloc-gpu.XXXXXX)}
mkdir -p "$WORK"
PY=${PYTHON:-python3}
exec > >(tee -a "$OUT/run.log") 2>&1
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
start=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - start )) s] $*"; }
