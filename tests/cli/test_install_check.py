"""A CPU-only torch beside a CUDA torchvision (the CPU index could not be reached): ``import torchvision`` fails with
"operator torchvision::nms does not exist", naming neither package.  The command says which two versions do not fit
and how to install a matching pair, in one line (simulated: torchvision's import raises torch's own error)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

SIMULATE = """
import importlib.abc, importlib.metadata as md, sys
class Mismatched(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "torchvision":  # what torchvision/_meta_registrations.py raises beside a torch of another build
            raise RuntimeError("operator torchvision::nms does not exist")
        return None
sys.meta_path.insert(0, Mismatched())
sys.modules.pop("torchvision", None)
real = md.version
md.version = lambda name: {"torch": "2.5.1+cpu", "torchvision": "0.20.1"}.get(name) or real(name)
from cloc_lightning.__main__ import main
main(ARGS)
"""


def _run(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-c", SIMULATE.replace("ARGS", repr(args))], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow  # CLI subprocess runs: the long tier (pytest -m slow)
def test_torch_and_torchvision_of_different_builds_are_one_line(tmp_path: Path) -> None:
    p = _run(["fit", "--config", "configs/cloc/demo.yaml"], tmp_path)
    assert p.returncode == 1, p.stderr[-3000:]
    lines = p.stderr.strip().splitlines()
    assert "Traceback" not in p.stderr and len(lines) <= 2, p.stderr
    first = lines[0]
    assert first.startswith("cloc-lightning: error: torchvision 0.20.1 (a CUDA build) does not fit torch 2.5.1+cpu"), first
    assert "operator torchvision::nms does not exist" in first
    assert "pip install --force-reinstall torch torchvision --index-url https://download.pytorch.org/whl/cpu" in first


@pytest.mark.slow  # CLI subprocess runs: the long tier (pytest -m slow)
def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    p = _run(["fit", "--help", "--debug"], tmp_path)
    assert p.returncode == 1 and "Traceback" in p.stderr and "torchvision::nms" in p.stderr
