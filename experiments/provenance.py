"""What a result was made with, written once for every result file: the experiment tables' records and the benchmarks'.

:func:`provenance` answers with the git commit and whether the tree had uncommitted changes, the versions of
the packages that make the numbers, the machine, the time and the command.  The runner stores it with every
table (``environment``) and a part of it with every run (``code``: :data:`CODE_KEYS`); ``benchmarks/harness.py``
adds it to every benchmark's result file.
"""

from __future__ import annotations

import importlib
import os
import platform
import subprocess
import time
from typing import Any

from experiments.paths import REPO

#: packages whose versions a result records (``None`` where one is not installed)
PACKAGES = (
    "lightning",
    "open_clip",
    "pytorch_metric_learning",
    "timm",
    "cloc_lightning",
    "sklearn",
    "torchmetrics",
    "jsonargparse",
    "numpy",
)
#: what a run's own record keeps of it (``code``): the tree and the two versions that decide the numbers
CODE_KEYS = ("git_commit", "git_dirty", "torch", "lightning")
#: what the runner and the benchmarks write: changes there are results, not code, and do not make the tree dirty
RESULTS = "benchmarks/results"

__all__ = ["PACKAGES", "CODE_KEYS", "RESULTS", "provenance", "git_state"]


def git_state() -> dict[str, Any]:
    """``{"git_commit", "git_dirty", "git_uncommitted"}`` of the checkout this code runs from (``None`` outside git).

    ``git_uncommitted``: the files with uncommitted changes outside :data:`RESULTS`; ``git_dirty``: whether there is one.
    """
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10).stdout.strip() or None
        status = subprocess.run(
            ["git", "status", "--porcelain", "--", ".", f":!{RESULTS}"], cwd=REPO, capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return {"git_commit": None, "git_dirty": None, "git_uncommitted": None}
    if not commit:
        return {"git_commit": None, "git_dirty": None, "git_uncommitted": None}
    files = [line[3:] for line in status.splitlines() if line.strip()]
    return {"git_commit": commit, "git_dirty": bool(files), "git_uncommitted": files}


def provenance(command: str | None = None) -> dict[str, Any]:
    """The versions, machine, time, git state and (given one) command of a result, as one flat dictionary.

    Keys: ``python``, ``torch``, ``machine``, ``cpu_count``, ``torch_threads``, ``cuda`` (the device's name or
    ``None``), ``date`` (local time of the call), ``load_average_1m``, one per :data:`PACKAGES` entry, then
    :func:`git_state`'s, then ``command`` where one is given.
    """
    import torch

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        # other processes on the machine (1-minute load average vs cpu_count) make CPU timings noisy
        "load_average_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
    }
    for pkg in PACKAGES:
        try:
            info[pkg] = importlib.import_module(pkg).__version__
        except Exception:  # noqa: BLE001 - optional peers
            info[pkg] = None
    info.update(git_state())
    if command is not None:
        info["command"] = command
    return info
