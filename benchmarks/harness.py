"""Shared measurement harness for ``benchmarks/``.

Rules every benchmark here follows (the numbers in docs/benchmarks.md come from them):

* **Side by side in one process**: the implementations being compared are timed
  in the same process, interleaved repeat by repeat (A B C, B C A, C A B, ...),
  so that drift of the machine (thermal, other load) hits all of them alike.
  We report medians and the inter-quartile range.
* **Peak memory** on CPU is measured in a fresh subprocess per implementation:
  after the case's inputs are built, freed heap memory is returned to the OS
  (``malloc_trim``), the kernel's resident-set high-water mark is reset (``"5"``
  written to ``/proc/self/clear_refs``) and the current RSS read as the baseline;
  after one call, ``VmHWM`` from ``/proc/self/status`` minus that baseline is the
  peak extra memory of the call (every allocation: tensors, autograd buffers,
  library workspaces).  ``ru_maxrss`` cannot do this: it is never reset, and a
  child started by a large process inherits its parent's mark.  Where
  ``clear_refs`` is not writable (non-Linux, some containers) the fallback is
  torch's own CPU allocator accounting: the profiler's memory events
  (``torch.profiler.profile(profile_memory=True)``), whose running sum's maximum
  is the peak of tensor memory only (no Python objects, no oneDNN/BLAS scratch).
  ``tracemalloc`` is not used: it does not see torch's allocations.  The method
  used is recorded with every result (``memory_method``); ``CLOC_BENCH_MEMORY=rss``
  or ``=torch`` forces one.  On CUDA it is ``torch.cuda.max_memory_allocated``.
* Every result file records the versions, thread count and device.

Usage from a benchmark module::

    cases = {"ours": lambda: step(ours), "reference": lambda: step(ref)}
    stats = time_interleaved(cases, repeats=15, warmup=2)
    mem = peak_memory_mb("benchmarks.bench_x:make_case", {"impl": "ours", "n": 512})
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import importlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from experiments.provenance import provenance
from experiments.render import markdown_table as markdown_table  # the benchmarks import it from here

RESULTS_DIR = Path(__file__).resolve().parent / "results"


@dataclass
class Stats:
    """Timing summary of one implementation, in milliseconds."""

    median_ms: float
    q25_ms: float
    q75_ms: float
    n: int

    def fmt(self) -> str:
        return f"{self.median_ms:.2f}"

    def fmt_iqr(self) -> str:
        """``median (q25-q75)`` with one decimal, as the result tables show it."""
        return f"{self.median_ms:.1f} ({self.q25_ms:.1f}-{self.q75_ms:.1f})"


def _sync(device: torch.device | str | None) -> None:
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def time_interleaved(
    cases: dict[str, Callable[[], Any]],
    repeats: int = 10,
    warmup: int = 2,
    device: torch.device | str | None = None,
    max_seconds: float | None = None,
) -> dict[str, Stats]:
    """Time every callable in ``cases`` interleaved; return per-case :class:`Stats`.

    ``warmup`` untimed rounds run first.  Each timed round runs every case once,
    the order rotated by one per round.  ``max_seconds`` stops early (after at
    least 3 rounds) when a slow reference would take too long.
    """
    names = list(cases)
    for _ in range(warmup):
        for name in names:
            cases[name]()
            _sync(device)
    times: dict[str, list[float]] = {n: [] for n in names}
    start = time.perf_counter()
    for rep in range(repeats):
        order = names[rep % len(names) :] + names[: rep % len(names)]
        for name in order:
            _sync(device)
            t0 = time.perf_counter()
            cases[name]()
            _sync(device)
            times[name].append((time.perf_counter() - t0) * 1e3)
        if max_seconds is not None and rep >= 2 and time.perf_counter() - start > max_seconds:
            break
    out = {}
    for name, ts in times.items():
        q = statistics.quantiles(ts, n=4) if len(ts) >= 2 else [ts[0]] * 3
        out[name] = Stats(statistics.median(ts), q[0], q[2], len(ts))
    return out


MEMORY_METHOD_ENV = "CLOC_BENCH_MEMORY"


def _status_mb(field: str) -> float:
    """A ``kB`` field of ``/proc/self/status`` (``VmRSS``, ``VmHWM``) in MiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/self/status has no {field} field")


def _reset_peak_rss() -> bool:
    """Reset this process' RSS high-water mark (``VmHWM``) to its current RSS; False if impossible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        _status_mb("VmHWM")
    except (OSError, RuntimeError):
        return False
    return True


def _trim_heap() -> None:
    """Return freed ``malloc`` memory to the OS (glibc), so the baseline RSS holds no free pages."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to trim
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def memory_method(device: torch.device | str = "cpu") -> str:
    """The peak-memory method :func:`peak_memory_mb` uses here: ``cuda``, ``rss`` or ``torch``."""
    if torch.device(device).type == "cuda":
        return "cuda"
    forced = os.environ.get(MEMORY_METHOD_ENV)
    if forced is not None:
        if forced not in ("rss", "torch"):
            raise ValueError(f"{MEMORY_METHOD_ENV} must be 'rss' or 'torch', got {forced!r}")
        return forced
    return "rss" if os.access("/proc/self/clear_refs", os.W_OK) and os.path.exists("/proc/self/status") else "torch"


def _peak_rss_of(fn: Callable[[], Any]) -> float:
    """Peak RSS growth (MiB) while ``fn()`` runs: ``VmHWM`` after it minus ``VmRSS`` at the reset."""
    _trim_heap()
    if not _reset_peak_rss():
        raise RuntimeError("/proc/self/clear_refs is not writable; use the 'torch' memory method")
    base = _status_mb("VmRSS")
    fn()
    return max(0.0, _status_mb("VmHWM") - base)


def _peak_torch_cpu_of(fn: Callable[[], Any]) -> float:
    """Peak of live CPU tensor memory (MiB) above the start while ``fn()`` runs, from torch's profiler.

    Every allocation and free of torch's CPU allocator is a profiler memory event with
    a signed byte count; the maximum of their running sum (in time order) is the peak.
    """
    from torch.profiler import ProfilerActivity, profile

    gc.collect()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    # the raw allocator events (signed byte counts) are only reachable through the profiler's
    # kineto results (``prof.events()`` folds most of them into the ops); checked by tests/benchmarks/test_bench_harness.py
    cpu = torch._C._autograd.DeviceType.CPU
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]" and e.device_type() == cpu]
    running = peak = 0
    for e in sorted(events, key=lambda e: e.start_ns()):
        running += e.nbytes()
        peak = max(peak, running)
    return peak / 2**20


def _measure_in_this_process(factory: str, kwargs: dict[str, Any]) -> float:
    mod_name, fn_name = factory.split(":")
    fn = getattr(importlib.import_module(mod_name), fn_name)(**kwargs)
    device = kwargs.get("device", "cpu")
    method = memory_method(device)
    if method == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - base) / 2**20
    if method == "rss":
        return _peak_rss_of(fn)
    return _peak_torch_cpu_of(fn)


def known_allocation_case(mib: int, free_first: bool = False) -> Callable[[], float]:
    """A calibration case for :func:`peak_memory_mb`: allocates and touches ``mib`` MiB of float32.

    With ``free_first`` it first allocates and frees ``2 * mib`` MiB, so the peak is ``2 * mib``.
    ``peak_memory_mb("benchmarks.harness:known_allocation_case", {"mib": 200})`` reads about 200
    (a little more for the interpreter with the ``rss`` method; exactly 200 with ``torch``).
    """

    def case() -> float:
        if free_first:
            tmp = torch.ones(2 * mib * 2**20 // 4)
            del tmp
        x = torch.ones(mib * 2**20 // 4)
        return float(x[-1])

    return case


def peak_memory_mb(factory: str, kwargs: dict[str, Any], timeout: float = 600) -> float:
    """Peak extra memory (MiB) of one call of ``factory(**kwargs)()`` in a fresh process.

    ``factory`` is ``"package.module:function"``; the function builds the inputs
    and returns a zero-argument callable running one fwd+bwd.  Building happens
    before the baseline is read, so only the call itself is counted.  The method
    (``rss``: ``VmHWM`` after a ``clear_refs`` reset; ``torch``: profiler memory
    events; ``cuda``) is :func:`memory_method`'s; see the module docstring.  The
    result does not depend on the calling process' size, so it may be called at
    any point of a benchmark.
    """
    code = (
        "import json,sys,torch;torch.set_num_threads(int(sys.argv[3]));"
        "from benchmarks.harness import _measure_in_this_process as m;"
        "print(json.dumps(m(sys.argv[1], json.loads(sys.argv[2]))))"
    )
    root = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    res = subprocess.run(
        [sys.executable, "-c", code, factory, json.dumps(kwargs), str(torch.get_num_threads())],
        capture_output=True,
        text=True,
        cwd=root,
        env=env,
        timeout=timeout,
    )
    if res.returncode != 0:
        raise RuntimeError(f"memory measurement of {factory}({kwargs}) failed:\n{res.stderr[-2000:]}")
    return float(res.stdout.strip().splitlines()[-1])


def busy_jiffies() -> int | None:
    """Non-idle CPU time of the whole machine in clock ticks (``/proc/stat``), or ``None`` off Linux."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    # user nice system idle iowait irq softirq steal ...: everything but idle and iowait
    return sum(fields) - fields[3] - (fields[4] if len(fields) > 4 else 0)


def environment() -> dict[str, Any]:
    """Versions, machine, time and git state recorded with every result (:func:`experiments.provenance.provenance`),
    and how peak memory is measured here (``memory_method``)."""
    return {**provenance(), "memory_method": memory_method("cuda" if torch.cuda.is_available() else "cpu")}


def write_results(name: str, markdown: str, data: dict[str, Any], command: str) -> Path:
    """Write ``results/<name>.md`` and ``results/<name>.json`` (with environment and command)."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    env = environment()
    load = f"; 1-min load average {env['load_average_1m']} on {env['cpu_count']} cores" if env.get("load_average_1m") is not None else ""
    header = (
        f"<!-- produced by: {command} -->\n\nMeasured {env['date']} on {env['cuda'] or 'CPU'} "
        f"(torch {env['torch']}, {env['torch_threads']} threads{load}).\n\n"
    )
    md_path = RESULTS_DIR / f"{name}.md"
    md_path.write_text(header + markdown + "\n")
    payload = {"command": command, "environment": env, "results": data}
    (RESULTS_DIR / f"{name}.json").write_text(
        json.dumps(payload, indent=2, default=lambda o: asdict(o) if hasattr(o, "__dataclass_fields__") else str(o))
    )
    return md_path
