"""Shared measurement harness for ``benchmarks/``.

Rules every benchmark here follows (the numbers in README come from them):

* **Side by side in one process**: the implementations being compared are timed
  in the same process, interleaved repeat by repeat (A B C, B C A, C A B, ...),
  so that drift of the machine (thermal, other load) hits all of them alike.
  We report medians and the inter-quartile range.
* **Peak memory** on CPU is measured in a fresh subprocess per implementation as
  the growth of the process' peak resident set size (``ru_maxrss``) while the
  case runs; large tensors are ``mmap``-ed by the allocator, so this tracks the
  real peak of fwd+bwd.  On CUDA it is ``torch.cuda.max_memory_allocated``.
* Every result file records the versions, thread count and device.

Usage from a benchmark module::

    cases = {"ours": lambda: step(ours), "reference": lambda: step(ref)}
    stats = time_interleaved(cases, repeats=15, warmup=2)
    mem = peak_memory_mb("benchmarks.bench_x:make_case", {"impl": "ours", "n": 512})
"""

from __future__ import annotations

import importlib
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import torch

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


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def _measure_in_this_process(factory: str, kwargs: dict[str, Any]) -> float:
    mod_name, fn_name = factory.split(":")
    fn = getattr(importlib.import_module(mod_name), fn_name)(**kwargs)
    device = kwargs.get("device", "cpu")
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - base) / 2**20
    base = _rss_mb()
    fn()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    return max(0.0, peak - base)


def peak_memory_mb(factory: str, kwargs: dict[str, Any], timeout: float = 600) -> float:
    """Peak extra memory (MiB) of one call of ``factory(**kwargs)()`` in a fresh process.

    ``factory`` is ``"package.module:function"``; the function builds the inputs
    and returns a zero-argument callable running one fwd+bwd.  Building happens
    before the baseline is read, so only the call itself is counted.
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


def environment() -> dict[str, Any]:
    """Versions and machine facts recorded with every result."""
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    for pkg in ("lightning", "open_clip", "pytorch_metric_learning", "timm"):
        try:
            info[pkg] = importlib.import_module(pkg).__version__
        except Exception:  # noqa: BLE001 - optional peers
            info[pkg] = None
    return info


def markdown_table(headers: list[str], rows: list[list[Any]]) -> str:
    """A GitHub markdown table."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def write_results(name: str, markdown: str, data: dict[str, Any], command: str) -> Path:
    """Write ``results/<name>.md`` and ``results/<name>.json`` (with environment and command)."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    env = environment()
    header = f"<!-- produced by: {command} -->\n\nMeasured {env['date']} on {env['cuda'] or 'CPU'} " f"(torch {env['torch']}, {env['torch_threads']} threads).\n\n"
    md_path = RESULTS_DIR / f"{name}.md"
    md_path.write_text(header + markdown + "\n")
    payload = {"command": command, "environment": env, "results": data}
    (RESULTS_DIR / f"{name}.json").write_text(json.dumps(payload, indent=2, default=lambda o: asdict(o) if hasattr(o, "__dataclass_fields__") else str(o)))
    return md_path
