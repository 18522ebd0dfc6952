"""Rank-N-Contrast loss fwd+bwd: ours vs the authors' computation, with SupCon's loss beside it for context.

Run with ``python -m benchmarks.bench_rnc`` (``--quick`` for a small smoke run that writes nothing).
Cases: ``M`` = 256, 512, 1024 views (``M / 2`` images x 2 views), dim 128, targets = integer ages
0..100 (ties in label distance, as real ranks have), tau = 2, L1 label distance, L2 feature
similarity (the paper's settings, Zha et al., NeurIPS 2023):

* ``ours`` -- :func:`cloc_lightning.losses.rnc.rnc_loss`: per anchor, the views sorted by label
  distance and a running log-sum-exp of the logits give every denominator at once
  (O(M^2 log M) time, O(M^2) memory);
* ``authors`` -- :func:`tests.references.rnc.rnc_authors_reference`, a reimplementation of the
  authors' computation (``loss.py`` of kaiwenzha/Rank-N-Contrast): a Python loop over the
  ``M - 1`` positive columns, each building an ``[M, M - 1]`` mask of its negatives
  (O(M^3) time, and the graph keeps every step's mask: O(M^3) memory);
* ``SupCon`` -- :func:`cloc_lightning.losses.supcon.supcon_loss` (dense) on the same features
  L2-normalised, the ages as classes, T = 0.1: the cost of a plain supervised contrastive loss at
  the same size, for context (issue 31 asks for RnC's cost beside SupCon's).

All three are timed interleaved in one process (``harness.time_interleaved``); peak memory is
measured per implementation in a fresh process (``harness.peak_memory_mb``).  Before timing,
ours and the authors' values and input gradients are compared on the benchmarked input.  Each
size records how many cores other processes kept busy during its timing (``/proc/stat`` less
this process's CPU time, as ``bench_sigmoid``); above a quarter of a core the section is marked
"machine busy" and its ratios are not idle-machine numbers.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks.bench_sigmoid import _busy, _OtherCPU
from benchmarks.harness import markdown_table, peak_memory_mb, time_interleaved, write_results
from cloc_lightning.losses.rnc import rnc_loss
from cloc_lightning.losses.supcon import supcon_loss
from tests.references.rnc import rnc_authors_reference

DIM = 128
TEMPERATURE = 2.0
SUPCON_TEMPERATURE = 0.1
MAX_AGE = 100
SIZES = (256, 512, 1024)
QUICK_SIZES = (64, 128)
IMPLS = ("ours", "authors", "supcon")
LABELS = {
    "ours": "ours (sorted running log-sum-exp)",
    "authors": "authors' loop over positives (reimplementation)",
    "supcon": "SupCon, ours (dense), for context",
}


def _inputs(views: int, dim: int = DIM, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Features ``[views / 2, 2, dim]`` (the second view a noisy copy of the first) and integer ages ``[views / 2]``."""
    g = torch.Generator().manual_seed(seed)
    n = views // 2
    first = torch.randn(n, dim, generator=g)
    features = torch.stack([first, first + 0.5 * torch.randn(n, dim, generator=g)], dim=1)
    return features, torch.randint(0, MAX_AGE + 1, (n,), generator=g)


def _loss_fn(impl: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    if impl == "ours":
        return lambda f, y: rnc_loss(f, y, temperature=TEMPERATURE)
    if impl == "authors":
        return lambda f, y: rnc_authors_reference(f, y, temperature=TEMPERATURE)
    if impl == "supcon":
        return lambda f, y: supcon_loss(F.normalize(f, dim=-1), y, temperature=SUPCON_TEMPERATURE, tile_size=None)
    raise ValueError(f"unknown impl {impl!r}")


def make_case(impl: str, views: int, dim: int = DIM) -> Callable[[], float]:
    """Build inputs; return a zero-argument fwd+bwd of ``impl`` (used for timing and memory)."""
    features, labels = _inputs(views, dim)
    fn = _loss_fn(impl)

    def step() -> float:
        x = features.detach().requires_grad_(True)
        loss = fn(x, labels)
        torch.autograd.backward(loss)
        return float(loss.detach())

    return step


def _value_and_grad(impl: str, views: int) -> tuple[float, torch.Tensor]:
    features, labels = _inputs(views)
    x = features.detach().requires_grad_(True)
    loss = _loss_fn(impl)(x, labels)
    torch.autograd.backward(loss)
    assert x.grad is not None
    return float(loss.detach()), x.grad


def _agreement(views: int) -> dict[str, float]:
    ours, g_ours = _value_and_grad("ours", views)
    ref, g_ref = _value_and_grad("authors", views)
    return {
        "loss_ours": ours,
        "loss_authors": ref,
        "abs_loss_diff": abs(ours - ref),
        "max_abs_grad_diff": float((g_ours - g_ref).abs().max()),
        "max_abs_grad": float(g_ref.abs().max()),
    }


def _section(views: int, repeats: int, quick: bool) -> dict[str, Any]:
    cases = {impl: make_case(impl, views) for impl in IMPLS}
    other = _OtherCPU()
    load = [round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None]
    other.start()
    stats = time_interleaved(cases, repeats=repeats, warmup=1, max_seconds=60 if quick else 600)
    other_cores = other.stop()
    load.append(round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None)
    mem = {impl: peak_memory_mb("benchmarks.bench_rnc:make_case", {"impl": impl, "views": views}) for impl in IMPLS}
    threads = torch.get_num_threads()
    return {
        "views": views,
        "agreement": _agreement(views),
        "stats": stats,
        "peak_memory_mb": mem,
        "threads": threads,
        "load_average_1m": load,
        "other_processes_cores": other_cores,
        "busy": _busy(other_cores, load, threads),
    }


def run(quick: bool = False, threads: int | None = None) -> tuple[str, dict[str, Any]]:
    """Run the benchmark; return (markdown, data).

    The full run (``quick=False``) also writes ``benchmarks/results/rnc.{md,json}``; ``quick=True``
    uses small sizes and few repeats and writes nothing.  ``threads``: torch threads of the timing
    and of the memory processes (default: torch's); 1 keeps a shared machine's other processes
    from stalling every parallel region (see ``bench_sigmoid``).
    """
    if threads is not None:
        torch.set_num_threads(threads)
    sizes = QUICK_SIZES if quick else SIZES
    repeats = 3 if quick else 7
    sections = [_section(v, repeats, quick) for v in sizes]
    rows = []
    for s in sections:
        st, mem, agree = s["stats"], s["peak_memory_mb"], s["agreement"]
        t_ours = st["ours"].median_ms
        for impl in IMPLS:
            rows.append(
                [
                    f"{s['views']} ({s['views'] // 2} x 2)" if impl == "ours" else "",
                    LABELS[impl],
                    st[impl].fmt_iqr(),
                    f"{st[impl].median_ms / t_ours:.2f}x",
                    f"{mem[impl]:.0f}",
                    f"{mem[impl] / mem['ours']:.1f}x" if mem["ours"] > 0 else "n/a",
                    "" if impl == "supcon" else f"{agree['loss_' + impl]:.6f}",
                ]
            )
    table = markdown_table(["views M", "implementation", "fwd+bwd ms (IQR)", "time / ours", "peak MiB", "memory / ours", "loss"], rows)
    agree_rows = [
        [
            str(s["views"]),
            f"{s['agreement']['abs_loss_diff']:.1e}",
            f"{s['agreement']['max_abs_grad_diff']:.1e}",
            f"{s['agreement']['max_abs_grad']:.1e}",
        ]
        for s in sections
    ]
    agree_table = markdown_table(
        ["views M", "loss difference (abs.)", "largest gradient difference (abs.)", "largest gradient (abs.)"], agree_rows
    )
    load_rows = [
        [
            str(s["views"]),
            str(s["threads"]),
            "-" if s["other_processes_cores"] is None else f"{s['other_processes_cores']:.2f}",
            " / ".join("-" if v is None else f"{v:.2f}" for v in s["load_average_1m"]),
            "**machine busy**" if s["busy"] else "idle",
        ]
        for s in sections
    ]
    load_table = markdown_table(
        ["views M", "torch threads", "cores used by other processes", "1-min load before / after", "timing conditions"], load_rows
    )
    busy = any(s["busy"] for s in sections)
    note = (
        "**Measured while other processes used the cores** (see the last table): the times are slower and noisier "
        "than on an idle machine, and the ratios are those of a shared machine, not idle-machine numbers. "
        if busy
        else ""
    )
    md = (
        f"### Rank-N-Contrast loss, fwd+bwd, dim {DIM}, integer ages 0-{MAX_AGE}, T = {TEMPERATURE}, L1 labels, L2 features\n\n"
        f"Median of {sections[0]['stats']['ours'].n} interleaved repeats per size (fewer where a size hit the time limit); "
        "peak memory = peak RSS above the baseline during one fwd+bwd in a fresh process (`VmHWM` after a `clear_refs` "
        f"reset, see `benchmarks/harness.py`). SupCon (T = {SUPCON_TEMPERATURE}, the ages as classes, L2-normalised "
        "features) is our dense SupCon loss at the same size, for context. "
        f"{note}\n\n{table}\n\n"
        "#### Agreement of ours with the authors' computation (float32, the benchmarked inputs)\n\n"
        f"{agree_table}\n\n#### Timing conditions\n\n{load_table}\n"
    )
    data: dict[str, Any] = {
        "case": {"dim": DIM, "temperature": TEMPERATURE, "max_age": MAX_AGE, "supcon_temperature": SUPCON_TEMPERATURE},
        "sections": {
            str(s["views"]): {
                "agreement": s["agreement"],
                "time_ms": {k: vars(v) for k, v in s["stats"].items()},
                "peak_memory_mb": s["peak_memory_mb"],
                "ratios": {
                    "authors_time_over_ours": s["stats"]["authors"].median_ms / s["stats"]["ours"].median_ms,
                    "supcon_time_over_ours": s["stats"]["supcon"].median_ms / s["stats"]["ours"].median_ms,
                    "authors_memory_over_ours": s["peak_memory_mb"]["authors"] / s["peak_memory_mb"]["ours"]
                    if s["peak_memory_mb"]["ours"] > 0
                    else None,
                },
                "threads": s["threads"],
                "load_average_1m": s["load_average_1m"],
                "other_processes_cores": s["other_processes_cores"],
                "busy": s["busy"],
            }
            for s in sections
        },
    }
    if not quick:  # a smoke run never overwrites the published numbers
        command = "python -m benchmarks.bench_rnc" + (f" --threads {threads}" if threads is not None else "")
        write_results("rnc", md, data, command)
    return md, data


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, few repeats (smoke run)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args()
    print(run(quick=args.quick, threads=args.threads)[0])
