"""SupCon loss fwd+bwd: ours (dense, tiled) vs pytorch-metric-learning vs SupContrast-style.

Run with ``python -m benchmarks.bench_supcon`` (``--quick`` for a small smoke run).
Main case: batch 2048 x 2 views, dim 128, 100 classes, temperature 0.07
(``base_temperature = temperature`` passed explicitly everywhere -- at T = 0.07 it is
also SupContrast's and our default 0.07 -- so all values must agree):

* ``ours (dense)``  -- :class:`cloc_lightning.losses.supcon.SupConLoss` with ``tile_size=None``
  (what ``'auto'`` picks at this size);
* ``ours (tiled)``  -- the same loss with row blocks of ``TILE`` anchors;
* ``PML``           -- ``pytorch_metric_learning.losses.SupConLoss`` (the real package) fed the
  ``[2N, dim]`` embeddings and the repeated labels;
* ``SupContrast-style`` -- :func:`tests.references.supcon.supcontrast_reference`, a reimplementation
  of the authors' dense computation.

Timings are interleaved medians in one process (``harness.time_interleaved``); peak
memory is measured per implementation in a fresh subprocess (``harness.peak_memory_mb``).
A scaling section compares dense vs tiled at larger batches (peers left out: their
``[N, N]`` masks need several GiB there).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks.harness import markdown_table, peak_memory_mb, time_interleaved, write_results
from cloc_lightning.losses.supcon import AUTO_DENSE_MAX_ELEMENTS, AUTO_TILE_ELEMENTS, supcon_loss
from tests.references.supcon import supcontrast_reference

TEMPERATURE = 0.07
N_CLASSES = 100
DIM = 128
VIEWS = 2
TILE = 512
GOALS = {"speedup_vs_pml": 3.0, "speedup_vs_supcontrast": 2.0, "memory_vs_pml": 0.25}
IMPLS = ("ours_dense", "ours_tiled", "pml", "supcontrast")
LABELS = {
    "ours_dense": "ours (dense)",
    "ours_tiled": f"ours (tiled, {TILE} rows)",
    "ours_auto": "ours ('auto')",
    "pml": "pytorch-metric-learning SupConLoss",
    "supcontrast": "SupContrast-style reference",
}


def _inputs(n: int, views: int, dim: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    feats = F.normalize(torch.randn(n, views, dim, generator=g), dim=-1)
    labels = torch.randint(0, N_CLASSES, (n,), generator=g)
    return feats, labels


def _loss_fn(impl: str, tile: int = TILE) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    if impl == "ours_dense":
        return lambda f, y: supcon_loss(f, y, temperature=TEMPERATURE, base_temperature=TEMPERATURE, tile_size=None)
    if impl == "ours_tiled":
        return lambda f, y: supcon_loss(f, y, temperature=TEMPERATURE, base_temperature=TEMPERATURE, tile_size=tile)
    if impl == "ours_auto":
        return lambda f, y: supcon_loss(f, y, temperature=TEMPERATURE, base_temperature=TEMPERATURE, tile_size="auto")
    if impl == "supcontrast":
        return lambda f, y: supcontrast_reference(f, y, temperature=TEMPERATURE, base_temperature=TEMPERATURE)
    if impl == "pml":
        from pytorch_metric_learning.losses import SupConLoss as PMLSupConLoss

        pml = PMLSupConLoss(temperature=TEMPERATURE)
        return lambda f, y: pml(torch.cat(torch.unbind(f, dim=1), dim=0), y.repeat(f.shape[1]))
    raise ValueError(f"unknown impl {impl!r}")


def make_case(impl: str, n: int, views: int = VIEWS, dim: int = DIM, tile: int = TILE) -> Callable[[], float]:
    """Build inputs; return a zero-argument fwd+bwd of ``impl`` (used for timing and memory)."""
    feats, labels = _inputs(n, views, dim)
    fn = _loss_fn(impl, tile)

    def step() -> float:
        x = feats.detach().requires_grad_(True)
        loss = fn(x, labels)
        loss.backward()
        return float(loss.detach())

    return step


def _peak_memory(impl: str, n: int) -> float:
    """``harness.peak_memory_mb`` of one fwd+bwd of ``impl`` at batch ``n`` (a fresh process)."""
    return peak_memory_mb("benchmarks.bench_supcon:make_case", {"impl": impl, "n": n})


def _value_and_grad(impl: str, n: int) -> tuple[float, torch.Tensor]:
    feats, labels = _inputs(n, VIEWS, DIM)
    x = feats.detach().requires_grad_(True)
    loss = _loss_fn(impl)(x, labels)
    loss.backward()
    assert x.grad is not None
    return float(loss.detach()), x.grad


def run(quick: bool = False) -> tuple[str, dict[str, Any]]:
    """Run the benchmark; return (markdown, data).

    The full run (``quick=False``) also writes ``benchmarks/results/supcon.{md,json}``;
    ``quick=True`` uses small sizes and few repeats and writes nothing.
    """
    n = 512 if quick else 2048
    repeats = 5 if quick else 15
    data: dict[str, Any] = {
        "case": {"batch": n, "views": VIEWS, "dim": DIM, "classes": N_CLASSES, "temperature": TEMPERATURE, "tile": TILE},
        "auto_dense_max_elements": AUTO_DENSE_MAX_ELEMENTS,
        "auto_tile_elements": AUTO_TILE_ELEMENTS,
    }

    # agreement of values (and of gradients where comparable) with ours (dense)
    ref_val, ref_grad = _value_and_grad("ours_dense", n)
    agreement = {}
    for impl in IMPLS:
        val, grad = _value_and_grad(impl, n)
        agreement[impl] = {
            "loss": val,
            "abs_diff_vs_ours": abs(val - ref_val),
            # PML normalises the embeddings itself, so its input gradient is projected onto the
            # sphere's tangent space; only the others are compared elementwise
            "max_grad_diff_vs_ours": None if impl == "pml" else float((grad - ref_grad).abs().max()),
        }
    data["agreement"] = agreement

    cases = {impl: make_case(impl, n) for impl in IMPLS}
    stats = time_interleaved(cases, repeats=repeats, warmup=2, max_seconds=300)
    mem = {impl: _peak_memory(impl, n) for impl in IMPLS}
    data["time_ms"] = {k: vars(v) for k, v in stats.items()}
    data["peak_memory_mb"] = mem

    t_ours = stats["ours_dense"].median_ms
    rows = []
    for impl in IMPLS:
        s = stats[impl]
        rows.append(
            [
                LABELS[impl],
                s.fmt_iqr(),
                f"{s.median_ms / t_ours:.2f}x",
                f"{mem[impl]:.0f}",
                f"{agreement[impl]['loss']:.6f}",
                f"{agreement[impl]['abs_diff_vs_ours']:.1e}",
            ]
        )
    table = markdown_table(["implementation", "fwd+bwd ms (IQR)", "time / ours dense", "peak MiB", "loss", "|loss - ours|"], rows)

    ratios = {
        "speedup_vs_pml_dense": stats["pml"].median_ms / t_ours,
        "speedup_vs_pml_tiled": stats["pml"].median_ms / stats["ours_tiled"].median_ms,
        "speedup_vs_supcontrast_dense": stats["supcontrast"].median_ms / t_ours,
        "speedup_vs_supcontrast_tiled": stats["supcontrast"].median_ms / stats["ours_tiled"].median_ms,
        "memory_vs_pml_dense": mem["ours_dense"] / mem["pml"] if mem["pml"] > 0 else float("nan"),
        "memory_vs_pml_tiled": mem["ours_tiled"] / mem["pml"] if mem["pml"] > 0 else float("nan"),
    }
    data["ratios"] = ratios

    def verdict(value: float, goal: float, higher: bool) -> str:
        ok = value >= goal if higher else value <= goal
        return "met" if ok else "NOT met"

    goal_rows = [
        [
            "speed vs PML",
            f">= {GOALS['speedup_vs_pml']:.0f}x",
            f"{ratios['speedup_vs_pml_dense']:.1f}x",
            f"{ratios['speedup_vs_pml_tiled']:.1f}x",
            verdict(ratios["speedup_vs_pml_dense"], GOALS["speedup_vs_pml"], True),
        ],
        [
            "speed vs SupContrast-style",
            f">= {GOALS['speedup_vs_supcontrast']:.0f}x",
            f"{ratios['speedup_vs_supcontrast_dense']:.1f}x",
            f"{ratios['speedup_vs_supcontrast_tiled']:.1f}x",
            verdict(ratios["speedup_vs_supcontrast_dense"], GOALS["speedup_vs_supcontrast"], True),
        ],
        [
            "peak memory vs PML",
            f"<= {GOALS['memory_vs_pml']:.2f}x",
            f"{ratios['memory_vs_pml_dense']:.3f}x",
            f"{ratios['memory_vs_pml_tiled']:.3f}x",
            verdict(ratios["memory_vs_pml_dense"], GOALS["memory_vs_pml"], False),
        ],
    ]
    goal_table = markdown_table(["goal", "target", "ours dense", "ours tiled", "dense"], goal_rows)

    # scaling: dense vs tiled ('auto') at large batches
    scale_ns = [1024, 2048] if quick else [4096, 8192]
    scaling = {}
    scale_rows = []
    for sn in scale_ns:
        sc = {impl: make_case(impl, sn) for impl in ("ours_dense", "ours_auto")}
        st = time_interleaved(sc, repeats=3, warmup=1, max_seconds=120)
        sm = {impl: _peak_memory(impl, sn) for impl in ("ours_dense", "ours_auto")}
        n_c = sn * VIEWS
        auto_tile = None if n_c * n_c <= AUTO_DENSE_MAX_ELEMENTS else max(32, AUTO_TILE_ELEMENTS // n_c)
        scaling[sn] = {"time_ms": {k: vars(v) for k, v in st.items()}, "peak_memory_mb": sm, "auto_tile": auto_tile}
        scale_rows.append(
            [
                f"{sn} x {VIEWS}",
                f"{st['ours_dense'].median_ms:.0f}",
                f"{sm['ours_dense']:.0f}",
                "dense" if auto_tile is None else f"tiled, {auto_tile} rows",
                f"{st['ours_auto'].median_ms:.0f}",
                f"{sm['ours_auto']:.0f}",
                f"{sm['ours_auto'] / sm['ours_dense']:.3f}" if sm["ours_dense"] > 0 else "n/a",
            ]
        )
    data["scaling"] = scaling
    scale_table = markdown_table(
        ["batch", "dense ms", "dense peak MiB", "'auto' picks", "'auto' ms", "'auto' peak MiB", "memory auto / dense"],
        scale_rows,
    )

    md = (
        f"### SupCon loss, fwd+bwd, batch {n} x {VIEWS} views, dim {DIM}, {N_CLASSES} classes, T = {TEMPERATURE}\n\n"
        f"Median of {stats['ours_dense'].n} interleaved repeats; peak memory = peak RSS above the baseline "
        f"during one fwd+bwd in a fresh process (`VmHWM` after a `clear_refs` reset, see `benchmarks/harness.py`). All losses use base_temperature = T, so the values must agree.\n\n"
        f"{table}\n\n#### Goals (issue 7)\n\n{goal_table}\n\n"
        f"#### Scaling: dense vs tiled (`tile_size='auto'`: dense while N_anchor x N <= {AUTO_DENSE_MAX_ELEMENTS})\n\n"
        f"{scale_table}\n"
    )
    if not quick:  # a smoke run never overwrites the published numbers
        write_results("supcon", md, data, "python -m benchmarks.bench_supcon")
    return md, data


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, few repeats (smoke run)")
    args = parser.parse_args()
    print(run(quick=args.quick)[0])
