#!/usr/bin/env bash
# Network side of the offline GPU run (docs/gpu.md): run where pip reaches PyPI and the shared data is,
# before carrying the checkout to a GPU node that has PyTorch but no network.
#
#   .ci/gpu/prepare.sh            # -> .ci/gpu/cache/wheels/*.whl and .ci/gpu/cache/data.tar.gz (git-ignored)
#
# * wheels: every line of .ci/gpu/wheels.txt as a py3-none-any wheel (`pip wheel --no-deps`: the wheel
#   from PyPI, or one built from an sdist-only release such as antlr4-python3-runtime); pure Python or
#   stable-ABI (abi3) x86_64 like wcwidth's, so they install on the node's Python 3.10+ whatever its minor version.
# * data: a deterministic subset of $CLOC_SHARED_DATA (default ../shared/data): CIFAR-10 JPEGs (all
#   10,000 training images, the first 200 test images of each class) and two UTKFace faces in three,
#   with data/README.md -- about 40 MB, enough for 25 full batches per epoch of every config.
#   CLOC_GPU_DATA=utkface instead: every UTKFace face and no CIFAR-10 (about 45 MB), the data of the
#   UTKFace experiment table that .ci/gpu/experiments.sh runs.
# * git.tar: the .git of a one-commit clone of this checkout's HEAD (about 1 MB), so the runs on the node
#   record the commit they ran and whether the tree had changes (the node gets the files, not .git).
#
# Environment: PYTHON (default python3), CLOC_SHARED_DATA, CLOC_GPU_CACHE (default .ci/gpu/cache),
# CLOC_GPU_DATA (subset, the default, or utkface).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
CACHE=${CLOC_GPU_CACHE:-.ci/gpu/cache}
DATA=${CLOC_SHARED_DATA:-../shared/data}
DATA_SET=${CLOC_GPU_DATA:-subset}
case "$DATA_SET" in subset|utkface) ;; *) echo "CLOC_GPU_DATA must be subset or utkface, not '$DATA_SET'" >&2; exit 2;; esac

mkdir -p "$CACHE/wheels"
echo "== wheels (.ci/gpu/wheels.txt) -> $CACHE/wheels"
"$PY" -m pip wheel -q --no-deps --disable-pip-version-check --no-cache-dir -r .ci/gpu/wheels.txt -w "$CACHE/wheels"
# exactly the listed versions, one each, all pure Python
"$PY" - "$CACHE/wheels" <<'EOF'
import re, sys
from pathlib import Path
folder = Path(sys.argv[1])
wanted = {}
for line in Path(".ci/gpu/wheels.txt").read_text().splitlines():
    line = line.split("#", 1)[0].strip()
    if line:
        name, version = line.split("==")
        wanted[re.sub(r"[-_.]+", "_", name).lower()] = version
found = {}
for whl in sorted(folder.glob("*.whl")):
    name, version = whl.name.split("-")[:2]
    key = re.sub(r"[-_.]+", "_", name).lower()
    if key not in wanted or wanted[key] != version:
        print(f"removing {whl.name}: not in wheels.txt (or another version)")
        whl.unlink()
        continue
    tags = whl.name[:-4].split("-")[-3:]  # python, abi, platform
    portable = tags[1:] == ["none", "any"] or (tags[1] == "abi3" and "x86_64" in tags[2] and "manylinux" in tags[2])
    if not portable:
        sys.exit(f"{whl.name} is neither pure Python (py3-none-any) nor a stable-ABI x86_64 wheel: it may not install on the node")
    found[key] = whl.name
missing = sorted(set(wanted) - set(found))
if missing:
    sys.exit(f"no wheel for {missing}")
print(f"{len(found)} wheels: " + ", ".join(sorted(found.values())))
EOF

echo "== data ($DATA) -> $CACHE/data.tar.gz"
if [ ! -d "$DATA/utkface" ] || { [ "$DATA_SET" = subset ] && [ ! -d "$DATA/cifar10" ]; }; then
  echo "no cifar10/ and utkface/ under $DATA: no data tar (the GPU tier then generates stand-ins; set CLOC_SHARED_DATA)" >&2
  exit 1
fi
"$PY" - "$DATA" "$CACHE/data.tar.gz" "$DATA_SET" <<'EOF'
import sys, tarfile
from pathlib import Path
data, out, data_set = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
files = []
if (data / "README.md").is_file():
    files.append(data / "README.md")
faces = sorted((data / "utkface").glob("*.jpg"))
if data_set == "utkface":  # the experiment table: every face, the split is the data module's own
    files += faces
else:
    files += sorted((data / "cifar10" / "train").rglob("*.jpg"))
    for folder in sorted(p for p in (data / "cifar10" / "test").iterdir() if p.is_dir()):
        files += sorted(folder.glob("*.jpg"))[:200]
    files += [p for i, p in enumerate(faces) if i % 3 != 0]  # two in three: ~3,650 training faces after the 0.7 split
tmp = out.with_suffix(".tmp")
with tarfile.open(tmp, "w:gz", compresslevel=1) as tar:
    for path in files:
        info = tar.gettarinfo(str(path), arcname=path.relative_to(data).as_posix())
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        info.mtime = 0
        with open(path, "rb") as f:
            tar.addfile(info, f)
tmp.replace(out)
print(f"{len(files)} files, {out.stat().st_size / 2**20:.1f} MiB")
EOF
echo "== git.tar: the .git of a one-commit clone of HEAD ($(git rev-parse --short HEAD))"
[ -z "$(git status --porcelain -- . ':!benchmarks/results')" ] || echo "note: uncommitted changes here; the node's runs will record HEAD + uncommitted changes"
clone=$(mktemp -d)
git clone -q --depth 1 --no-local "file://$PWD" "$clone/repo"
tar -cf "$CACHE/git.tar" -C "$clone/repo" .git
rm -rf "$clone"
du -sh "$CACHE"
echo "carry to the node: $CACHE (see docs/gpu.md)"
