# Sourced by .ci/gpu/run.sh and .ci/gpu/experiments.sh on an offline GPU node (docs/gpu.md): steps 1 and 2
# of both.  Expects REPO (this checkout), WORK (a scratch folder), CACHE (what .ci/gpu/prepare.sh made),
# PY (the node's Python) and a `stamp` function; sets VPY (the layered venv's Python) and, where the
# data tar was carried, exports CLOC_SHARED_DATA.
# ---------------------------------------------------------------- 1. environment
stamp "environment: $WORK/venv over the node's Python"
"$PY" -m venv --without-pip "$WORK/venv" || exit 1
VPY=$WORK/venv/bin/python
SITE=$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# the node's site folders (and any .pth files in them), after the venv's own
"$PY" -c '
import site, sys
dirs = list(site.getsitepackages()) + ([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])
print("import site; " + "; ".join(f"site.addsitedir({d!r})" for d in dirs))
' > "$SITE/_cloc_gpu_node_site.pth" || exit 1
if ! "$VPY" -c 'import torch, lightning, pip' 2>/dev/null; then
  echo "the venv does not see the node's torch/lightning/pip through $SITE/_cloc_gpu_node_site.pth"; exit 1
fi
shopt -s nullglob
wheels=("$CACHE"/wheels/*.whl)
if [ ${#wheels[@]} -eq 0 ]; then
  echo "no wheels in $CACHE/wheels: run .ci/gpu/prepare.sh where pip reaches PyPI and carry $CACHE along"
else
  "$VPY" -m pip install -q --no-index --no-deps --no-cache-dir "${wheels[@]}" || exit 1
  echo "installed ${#wheels[@]} carried wheels"
fi
"$VPY" -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir -e "$REPO" || exit 1
"$VPY" - <<'EOF' || exit 1
import cloc_lightning, cloc_lightning.cli, open_clip, jsonargparse
from lightning.pytorch.cli import _JSONARGPARSE_SIGNATURES_AVAILABLE
print(f"cloc_lightning from {cloc_lightning.__file__}; open_clip {open_clip.__version__}, jsonargparse {jsonargparse.__version__}")
assert _JSONARGPARSE_SIGNATURES_AVAILABLE, "LightningCLI does not find jsonargparse[signatures] (docstring-parser, typeshed-client)"
EOF

# ---------------------------------------------------------------- 2. data
if [ -f "$CACHE/data.tar.gz" ]; then
  mkdir -p "$WORK/data" && tar -xzf "$CACHE/data.tar.gz" -C "$WORK/data" || exit 1
  export CLOC_SHARED_DATA=$WORK/data
  stamp "data: $CACHE/data.tar.gz -> $CLOC_SHARED_DATA ($(find "$WORK/data" -name '*.jpg' | wc -l) images)"
else
  stamp "data: no $CACHE/data.tar.gz; the GPU tier uses ${CLOC_SHARED_DATA:-../shared/data} or generated stand-ins"
fi

