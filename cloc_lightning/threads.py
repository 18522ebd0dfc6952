"""How many intra-op threads a ``cloc-lightning`` run gives torch: the cores this process may use, less its loader workers.

torch starts one intra-op (OpenMP) thread per core it sees.  Beside the data loader's worker
processes (``num_workers``, each busy on a core) and any other job on the machine, those threads
outnumber the cores, and OpenMP threads that wait for one another spin instead of sleeping: a
step then takes several times longer than with fewer threads.  Measured on 2 shared cores
(docs/development.md, "Threads and loader workers"): the demo config's epoch of 10 steps took
159-236 s with torch's 2 threads and 65-93 s with 1, beside the loader's worker and a load of 11-16.

So every ``cloc-lightning fit|validate|test|predict`` sets (:func:`apply_default_threads`)::

    threads = min(torch's own default, max(1, cores // processes on this node - loader workers))

``cores`` (:func:`available_cpus`) are those of the process's CPU affinity (``taskset``, Slurm,
``docker --cpuset-cpus``), further limited by a cgroup CPU quota (``docker --cpus``,
Kubernetes limits).  ``OMP_NUM_THREADS`` in the environment always wins: nothing is changed.
"""

from __future__ import annotations

import math
import os
from typing import Any

import torch

__all__ = ["available_cpus", "default_threads", "apply_default_threads", "restore_threads"]

#: the cgroup v2 file holding the CPU quota ("max 100000" or "<quota> <period>")
CGROUP_CPU_MAX = "/sys/fs/cgroup/cpu.max"


def available_cpus() -> int:
    """The cores this process may run on: its CPU affinity, limited by a cgroup (v2) CPU quota when there is one."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        with open(CGROUP_CPU_MAX) as f:
            quota, period = f.read().split()[:2]
        if quota != "max" and float(period) > 0:
            cpus = min(cpus, max(1, math.ceil(float(quota) / float(period))))
    except (OSError, ValueError):
        pass
    return max(1, cpus)


def default_threads(workers: int, processes: int = 1, cpus: int | None = None) -> int:
    """``max(1, cpus // processes - workers)``: one thread per core left to each process by its loader workers."""
    cpus = available_cpus() if cpus is None else cpus
    return max(1, cpus // max(1, processes) - max(0, workers))


def apply_default_threads(trainer: Any, datamodule: Any) -> tuple[int, str | None] | None:
    """Lower torch's intra-op threads to :func:`default_threads` for this run (unless ``OMP_NUM_THREADS`` is set).

    Also sets ``OMP_NUM_THREADS`` (as Lightning's DDP launchers do), so the processes a launcher
    starts keep the same count.  Returns what :func:`restore_threads` needs to undo it (``None``: nothing changed).
    """
    if os.environ.get("OMP_NUM_THREADS"):
        return None
    workers = getattr(datamodule, "num_workers", 0) if datamodule is not None else 0
    processes = getattr(trainer, "num_devices", 1) if trainer is not None else 1
    try:
        workers, processes = int(workers or 0), int(processes or 1)
    except (TypeError, ValueError):
        workers, processes = 0, 1
    before = torch.get_num_threads()
    threads = min(before, default_threads(workers, processes))
    if threads == before:
        return None
    torch.set_num_threads(threads)
    previous_env = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = str(threads)
    return before, previous_env


def restore_threads(changed: tuple[int, str | None] | None) -> None:
    """Undo :func:`apply_default_threads` (for ``cloc_lightning.cli.main`` called in a longer-lived process)."""
    if changed is None:
        return
    before, previous_env = changed
    torch.set_num_threads(before)
    if previous_env is None:
        os.environ.pop("OMP_NUM_THREADS", None)
    else:
        os.environ["OMP_NUM_THREADS"] = previous_env
