#!/usr/bin/env bash
# A stand-in for an offline GPU node's Python, for the CPU dry run of .ci/gpu/run.sh (docs/gpu.md).
#
#   PYTHON=/path/to/dev-venv/bin/python .ci/gpu/fake_node.sh [/tmp/cloc-fake-node]
#   PYTHON=/tmp/cloc-fake-node/bin/python OUT=/tmp/cloc-dry-run .ci/gpu/run.sh
#
# Makes a virtual environment (no pip of its own) that sees, through a .pth file, only those packages
# of the development environment that the lent GPU machines' image has (.ci/gpu/node_packages.txt, with
# the requirements of those packages):
# torch, lightning, timm, pytest, ... but not open_clip, jsonargparse, lightly, nbclient, mkdocs, nor
# cloc_lightning itself -- what run.sh must bring from the carried wheels.  The torch version stays
# the development one (the node has 2.11); everything else about the install path is the node's.
set -euo pipefail
cd "$(dirname "$0")/../.."
SRC=${PYTHON:-python3}
FAKE=${1:-/tmp/cloc-fake-node}
rm -rf "$FAKE"
"$SRC" -m venv --without-pip "$FAKE"
"$SRC" - "$FAKE" .ci/gpu/node_packages.txt <<'EOF'
import importlib.metadata as md
import re
import subprocess
import sys
from pathlib import Path

fake, listing = Path(sys.argv[1]), Path(sys.argv[2])
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()  # noqa: E731
wanted = {norm(line.strip()) for line in listing.read_text().splitlines() if line.strip() and not line.startswith("#")}
dists = {norm(d.metadata["Name"]): d for d in md.distributions()}
# the node's packages have their own requirements installed: add the closure (not extras) present here
from packaging.requirements import Requirement  # noqa: E402

todo = [n for n in wanted if n in dists]
while todo:
    for spec in dists[todo.pop()].requires or []:
        req = Requirement(spec)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = norm(req.name)
        if name not in wanted and name in dists:
            wanted.add(name)
            todo.append(name)
farm = fake / "node-site-packages"
farm.mkdir()
linked, names = 0, set()
for name, dist in dists.items():
    if name not in wanted or name in names:
        continue
    names.add(name)
    for top in {f.parts[0] for f in dist.files or [] if f.parts and f.parts[0] != ".." and not f.parts[0].endswith(".data")}:
        src, dst = Path(dist.locate_file(top)), farm / top
        if src.exists() and not dst.exists():
            dst.symlink_to(src.resolve())
            linked += 1
site = subprocess.run([str(fake / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                      check=True, capture_output=True, text=True).stdout.strip()
Path(site, "_fake_node.pth").write_text(f"import site; site.addsitedir({str(farm)!r})\n")
print(f"{fake}: {len(names)} of the node's {len(wanted)} packages from {sys.prefix} ({linked} links in {farm})")
missing = sorted(wanted - names)
print(f"not in the development environment (so not in the stand-in either): {len(missing)}")
EOF
cd /tmp  # not the checkout: cloc_lightning must not be importable from the working directory
"$FAKE/bin/python" - <<'EOF'
import importlib.util as u
have = [m for m in ("torch", "lightning", "timm", "torchvision", "torchmetrics", "sklearn", "tensorboard", "pytest", "pip") if u.find_spec(m)]
lack = [m for m in ("open_clip", "jsonargparse", "lightly", "ftfy", "nbclient", "mkdocs", "cloc_lightning") if u.find_spec(m)]
print("sees:", ", ".join(have))
assert not lack, f"the stand-in must not see {lack}"
print("does not see: open_clip, jsonargparse, lightly, ftfy, nbclient, mkdocs, cloc_lightning")
EOF
