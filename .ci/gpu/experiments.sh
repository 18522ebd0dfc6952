#!/usr/bin/env bash
# The UTKFace experiment table on one GPU of an offline node (issue 31, item 5; docs/results.md, docs/gpu.md).
#
#   CLOC_GPU_DATA=utkface .ci/gpu/prepare.sh     # where pip and ../shared/data are: wheels, every face, git.tar
#   .ci/gpu/experiments.sh                       # on the node (carry .ci/gpu/cache along, about 55 MB)
#
# The same rows, configs and runner as the CPU table (`python -m experiments utkface`), at a
# larger scale: every row gets `--extra` $CLOC_GPU_TABLE_EXTRA (default: 128 px, 20 epochs, the GPU,
# 2 loader workers per run).  The runs share the one device and the node's CPUs: one runner process per
# row (CE, CLOC mm, CORN, CORAL: seeds 0, 1, 2 one after another) and one per seed of the two-stage
# Rank-N-Contrast chain (stage one, then its linear regressor), side by side, all in the same run
# folder.  A runner starts no run that its row's last wall time says will not finish before the budget
# (CLOC_GPU_TABLE_BUDGET seconds, default 420); at the budget every runner gets SIGTERM (the preemption
# callback writes last.ckpt; such a run is not in the table).  Then one render of every row over all
# the finished runs (`--deadline` in the past: it starts nothing) writes
# benchmarks/results/experiments/$CLOC_GPU_TABLE_NAME/utkface.{md,json} and utkface_curves.png, copied
# to $OUT with the runs' logs (runs.tar.gz: every run folder without checkpoints) and run.log.
# Wall times are those of runs sharing the device and the CPUs (docs/results.md says so beside the table).
#
# Environment: as .ci/gpu/run.sh (PYTHON, CLOC_GPU_CACHE, CLOC_GPU_WORK, OUT), and CLOC_GPU_TABLE_BUDGET,
# CLOC_GPU_TABLE_EXTRA, CLOC_GPU_TABLE_NAME (default h200_128px), CLOC_GPU_TABLE_ROWS (the row groups,
# default "ce cloc_mm corn coral rnc"; rnc runs as one chain per seed), CLOC_GPU_TABLE_PREVIOUS (an earlier
# call's runs.tar.gz, whose finished runs are rendered with this call's: a table filled over two calls),
# CLOC_GPU_TABLE_DRY=1 (a dry run on the CPU: --quick settings, no GPU; checks the script, measures nothing).
set -uo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=.ci/gpu/prologue.sh
source .ci/gpu/prologue.sh || exit 1

budget=${CLOC_GPU_TABLE_BUDGET:-420}
name=${CLOC_GPU_TABLE_NAME:-h200_128px}
groups=${CLOC_GPU_TABLE_ROWS:-ce cloc_mm corn coral rnc}
dry=${CLOC_GPU_TABLE_DRY:-0}
if [ "$dry" = 1 ]; then
  extra=${CLOC_GPU_TABLE_EXTRA:---trainer.accelerator cpu --data.num_workers 0}
  quick=--quick
else
  extra=${CLOC_GPU_TABLE_EXTRA:---data.image_size 128 --trainer.max_epochs 20 --trainer.accelerator gpu --trainer.devices 1 --data.num_workers 2}
  quick=
fi
stamp "the node: $(uname -srm), $(nproc) CPUs; $("$PY" -V 2>&1); budget $budget s; --extra $extra"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader

# shellcheck source=.ci/gpu/env.sh
source "$REPO/.ci/gpu/env.sh" || exit 1
if [ -z "${CLOC_SHARED_DATA:-}" ] || [ ! -d "$CLOC_SHARED_DATA/utkface" ]; then
  echo "no UTKFace data: carry .ci/gpu/cache/data.tar.gz made with CLOC_GPU_DATA=utkface .ci/gpu/prepare.sh"; exit 1
fi
# the commit the runs record: the node gets the files, and no .git or one left from an older copy
# (seen on a lent machine: the .git of an earlier commit under this tree), so git.tar's replaces it
if [ -f "$CACHE/git.tar" ]; then
  [ -d .git ] && mv .git "$WORK/node.git"
  tar -xf "$CACHE/git.tar" -C "$REPO" && stamp "git: $(git -C "$REPO" rev-parse --short HEAD 2>&1) from $CACHE/git.tar"
fi
git config --global --add safe.directory "$REPO" 2>/dev/null || true
[ -n "$(git -C "$REPO" status --porcelain -- . ':!benchmarks/results' 2>/dev/null)" ] && \
  git -C "$REPO" status --short -- . ':!benchmarks/results' | head -20

# the rows of a group: a chain (a source row and the rows that start from its weights) or one row
rows_of() { case "$1" in rnc) echo rnc rnc_linear;; simclr) echo simclr ce_simclr cloc_mm_simclr;; *) echo "$1";; esac; }
runs=runs/gpu_table_$name
dest=benchmarks/results/experiments/$name
if [ -n "${CLOC_GPU_TABLE_PREVIOUS:-}" ]; then  # the runs.tar.gz of an earlier call: its finished runs join the render
  # except the rows this call runs (they run afresh: the tar has no checkpoints for a stage two to start from)
  skip=()
  for g in $groups; do
    for r in $(rows_of "$g"); do skip+=(--exclude="$runs/$r"); done
  done
  tar -xzf "$CLOC_GPU_TABLE_PREVIOUS" -C "$REPO" "${skip[@]}" "$runs" || exit 1
  stamp "previous runs from $CLOC_GPU_TABLE_PREVIOUS: $(find "$runs" -name result.json | wc -l) run folders"
fi
deadline=$(( $(date +%s) + budget ))
iso=$(date -u -d "@$deadline" +%Y-%m-%dT%H:%M:%S)
seeds="0 1 2"
[ "$dry" = 1 ] && seeds="0 1"
pids=()
launch() {  # launch <log name> <runner arguments...>
  local tag=$1; shift
  # shellcheck disable=SC2086  # $quick and $extra are word lists
  timeout -s TERM -k 30 $(( deadline - $(date +%s) )) "$VPY" -m experiments utkface $quick "$@" \
    --runs-dir "$runs" --out "$WORK/out_$tag" --data-root "$CLOC_SHARED_DATA" --deadline "$iso" --extra $extra \
    > "$WORK/$tag.log" 2>&1 &
  pids+=($!)
}
all_rows=()
for g in $groups; do
  read -ra rows <<< "$(rows_of "$g")"
  if [ ${#rows[@]} -gt 1 ]; then  # a chain: one runner per seed, so the seeds' chains run side by side
    for s in $seeds; do launch "${g}_seed$s" --rows "${rows[@]}" --seeds "$s"; done
  else
    # shellcheck disable=SC2086
    launch "$g" --rows "$g" --seeds $seeds
  fi
  all_rows+=("${rows[@]}")
done
stamp "${#pids[@]} runner processes until $iso UTC: ${all_rows[*]}"
while sleep 30; do
  alive=0
  for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=$((alive + 1)); done
  [ $alive -eq 0 ] && break
  stamp "$alive runners going; $(cat "$WORK"/*.log | grep -c ': ok in') runs finished; GPU: $(nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader 2>/dev/null | tr '\n' ' ')"
done
wait "${pids[@]}"  # not a bare wait: that also waits for the tee of the log
grep -h "\] utkface/" "$WORK"/*.log | grep -v "running \.\.\." || true

# every row with a run folder (this call's and CLOC_GPU_TABLE_PREVIOUS's), in the table's order
mapfile -t all_rows < <(find "$runs" -mindepth 1 -maxdepth 1 -type d -printf '%f\n' | sort)
stamp "render: ${all_rows[*]} over the finished runs -> $dest"
# shellcheck disable=SC2086
"$VPY" -m experiments utkface $quick --rows "${all_rows[@]}" --seeds $seeds --runs-dir "$runs" --out "$dest" \
  --data-root "$CLOC_SHARED_DATA" --deadline 2000-01-01T00:00 --extra $extra > "$WORK/render.log" 2>&1
rc=$?
tail -5 "$WORK/render.log"
for f in "$dest/utkface.md" "$dest/utkface.json" "$dest/utkface_curves.png"; do [ -f "$f" ] && cp "$f" "$OUT/"; done
tar --exclude='*.ckpt' --exclude='*.pt' -czf "$OUT/runs.tar.gz" "$runs" "$WORK"/*.log 2>/dev/null
stamp "done (render exit $rc); in $OUT:"
ls -l "$OUT"
[ $rc -eq 0 ]
