"""Reused CPU work matrices for the fused losses: no page faults for the ``[n, N]`` buffers of every call.

glibc returns a freed multi-megabyte block to the kernel (``mmap`` threshold, heap trimming), so a
``[2048, 2048]`` float32 matrix allocated on every call lands on freshly mapped pages: about 4,100
minor page faults (16 MiB), which cost the sigmoid loss 15-35 % of its time on the 2-core machine
(``benchmarks/bench_sigmoid.py``, "The guard", glibc default against freed memory kept).  How much a
call pays depended on what the process freed before it, which is what moved the benchmark's ratios
between runs.  CUDA has its caching allocator; on CPU the buffers are kept here instead.

A buffer is handed out only while nothing but this pool refers to it (its Python reference count):
a matrix kept for backward on an autograd context stays taken until the graph is freed, whatever
``retain_graph`` is, so reuse never overwrites a live result.  The pool keeps the buffers of the last
:data:`MAX_SHAPES` shapes and dtypes asked for (a training loop asks for the same ones every step),
at most :data:`MAX_BUFFERS` of each.
"""

from __future__ import annotations

import sys
import threading

import torch

__all__ = ["MAX_BUFFERS", "MAX_SHAPES", "work_matrix", "clear"]

#: buffers kept per shape and dtype (the sigmoid loss holds up to four at once on one process, and the previous step's
#: result may still hold one)
MAX_BUFFERS = 6
#: shapes and dtypes kept (the sigmoid loss asks for two: its [n, N] matrices and its row-block scratch)
MAX_SHAPES = 4

_lock = threading.Lock()
_pools: dict[tuple[int, int, torch.dtype], list[torch.Tensor]] = {}


def work_matrix(rows: int, cols: int, like: torch.Tensor) -> torch.Tensor:
    """An uninitialised ``[rows, cols]`` matrix of ``like``'s dtype and device, reused on CPU when one is free."""
    if like.device.type != "cpu":
        return like.new_empty(rows, cols)
    key = (rows, cols, like.dtype)
    with _lock:
        pool = _pools.pop(key, [])
        _pools[key] = pool  # the newest shape last
        while len(_pools) > MAX_SHAPES:
            del _pools[next(iter(_pools))]
        for buf in pool:
            # references: the pool's list, the loop variable and getrefcount's argument: nothing else holds it
            if sys.getrefcount(buf) <= 3:
                return buf
        buf = like.new_empty(rows, cols)
        if len(pool) < MAX_BUFFERS:
            pool.append(buf)
        return buf


def clear() -> None:
    """Drop the kept buffers (their memory is freed once no result refers to them)."""
    with _lock:
        _pools.clear()
