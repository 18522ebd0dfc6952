"""Run a function on 2 CPU processes with the gloo backend (for DDP equivalence tests).

``run_distributed(fn, world_size, *args)`` spawns ``world_size`` processes; each
calls ``fn(rank, world_size, *args)`` inside an initialised gloo process group
and returns a picklable result.  The list of per-rank results comes back to the
caller, so assertions run in the pytest process.  ``fn`` must be defined at
module level (spawned processes import it by name).
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _worker(rank: int, world_size: int, init_file: str, out_dir: str, fn: Callable[..., Any], args: tuple) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        result = fn(rank, world_size, *args)
        torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.barrier()
        dist.destroy_process_group()
    # Done and saved: leave without the interpreter's shutdown, during which a gloo process sometimes
    # aborts ("terminate called without an active exception", SIGABRT; see tests/e2e/test_e2e.py::test_ddp).
    # An exception above still propagates to torch.multiprocessing, which reports it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


GLOO_EXIT_ABORT = "terminate called without an active exception"


def gloo_exit_abort(output: str, aborted: bool) -> bool:
    """Whether a failed DDP run is gloo's known abort while an interpreter exits (pytorch/pytorch#190489).

    ``output`` is the run's stderr (or the error that carries it), ``aborted`` whether a process
    ended with SIGABRT (exit code -6).  Only that exact abort qualifies for one fresh attempt in
    the tests; docs/distributed.md ("Known: gloo's exit abort on CPU") says why the library does
    not paper over it.
    """
    return aborted and GLOO_EXIT_ABORT in output


def run_distributed(fn: Callable[..., Any], world_size: int = 2, *args: Any) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` gloo processes; return their results."""
    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "init")
        mp.spawn(_worker, args=(world_size, init_file, tmp, fn, args), nprocs=world_size, join=True)
        return [torch.load(os.path.join(tmp, f"rank{r}.pt"), weights_only=False) for r in range(world_size)]
