"""The RnC benchmark: its reimplementation of the authors' computation is the loss of eq. 2, and the smoke run works."""

from __future__ import annotations

import math

import pytest
import torch

from benchmarks import bench_rnc
from benchmarks.__main__ import ORDER, available
from tests.losses.test_rnc import rnc_reference
from tests.references.rnc import rnc_authors_reference


@pytest.mark.parametrize(("bsz", "dim", "tau"), [(1, 3, 2.0), (4, 5, 2.0), (7, 4, 0.5)])
def test_the_authors_computation_is_eq2_values_and_gradients(bsz: int, dim: int, tau: float) -> None:
    g = torch.Generator().manual_seed(bsz * 10 + dim)
    features = torch.randn(bsz, 2, dim, generator=g, dtype=torch.float64)
    labels = torch.randint(0, 3, (bsz,), generator=g)  # ties in label distance
    a, b = features.clone().requires_grad_(True), features.clone().requires_grad_(True)
    ours, ref = rnc_authors_reference(a, labels, tau), rnc_reference(b, labels, tau)
    assert torch.allclose(ours, ref, rtol=1e-10)
    (ga,) = torch.autograd.grad(ours, a)
    (gb,) = torch.autograd.grad(ref, b)
    assert torch.allclose(ga, gb, rtol=1e-8, atol=1e-12)
    with pytest.raises(ValueError, match=r"features must be \[bsz, 2, dim\]"):
        rnc_authors_reference(torch.randn(4, 3, dim), labels[:1].repeat(4))


def test_every_case_runs_and_the_benchmark_is_registered() -> None:
    for impl in bench_rnc.IMPLS:
        assert math.isfinite(bench_rnc.make_case(impl, views=16)())
    agreement = bench_rnc._agreement(32)
    assert agreement["abs_loss_diff"] < 1e-5 and agreement["max_abs_grad_diff"] < 1e-6
    assert "rnc" in ORDER and "rnc" in available()
    with pytest.raises(ValueError, match="unknown impl"):
        bench_rnc._loss_fn("nope")


@pytest.mark.slow
def test_quick_run_writes_nothing_and_reports_every_implementation(monkeypatch: pytest.MonkeyPatch) -> None:
    written: list[str] = []
    monkeypatch.setattr(bench_rnc, "write_results", lambda *a, **k: written.append(a[0]))
    monkeypatch.setattr(bench_rnc, "QUICK_SIZES", (32,))
    md, data = bench_rnc.run(quick=True)
    assert not written and set(data["sections"]) == {"32"}
    assert all(label in md for label in bench_rnc.LABELS.values()) and "Timing conditions" in md
    section = data["sections"]["32"]
    assert section["agreement"]["abs_loss_diff"] < 1e-5 and set(section["peak_memory_mb"]) == set(bench_rnc.IMPLS)
