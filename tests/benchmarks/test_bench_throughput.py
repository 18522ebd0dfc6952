"""benchmarks/bench_throughput.py: the batched colour jitter against torchvision, the EMA update, and a smoke run.

No timing is asserted: the smoke run checks the structure and that every loop really trained.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torchvision.transforms.v2 import functional as TF

from benchmarks import bench_throughput as bt
from benchmarks.__main__ import ORDER, available


def _torchvision_jitter(x: torch.Tensor, factors: list[torch.Tensor], order: tuple[int, ...], gray: torch.Tensor) -> torch.Tensor:
    """The reference: torchvision's functional colour ops, one image at a time."""
    ops = [TF.adjust_brightness, TF.adjust_contrast, TF.adjust_saturation, TF.adjust_hue]
    out = []
    for i in range(x.shape[0]):
        y = x[i]
        for op in order:
            y = ops[op](y, float(factors[op][i]))
        if gray[i]:
            y = TF.rgb_to_grayscale(y, num_output_channels=3)
        out.append(y)
    return torch.stack(out)


@pytest.mark.parametrize("order", [(0,), (1,), (2,), (3,), (0, 1, 2, 3), (3, 2, 1, 0), (2, 0, 3, 1)])
def test_batched_color_jitter_matches_torchvision(order: tuple[int, ...]) -> None:
    g = torch.Generator().manual_seed(0)
    b = 7
    x = torch.rand(b, 3, 13, 11, generator=g)
    x[0] = 0.5  # gray: no hue, zero saturation
    x[1, :, :3] = 0.0  # black pixels (max = 0)
    x[2, 1] = x[2, 0]  # ties between the largest channels
    factors = [torch.rand(b, generator=g) * 0.8 + 0.6 for _ in range(3)] + [torch.rand(b, generator=g) * 0.2 - 0.1]
    factors[0][3] = factors[1][3] = factors[2][3] = 1.0  # an unchanged sample
    factors[3][3] = 0.0
    gray = torch.tensor([False, True, False, False, True, False, False])
    got = bt.batched_color_jitter(x, *factors, order=order, grayscale=gray)
    ref = _torchvision_jitter(x, factors, order, gray)
    assert got.shape == x.shape
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
    torch.testing.assert_close(got[3], x[3], atol=1e-5, rtol=0)  # identity factors leave a sample as it is


def test_random_color_jitter_is_per_sample_and_in_range() -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.rand(64, 3, 8, 8, generator=g)
    y = bt.random_color_jitter(x, p=0.8, grayscale_p=0.2, generator=g)
    assert y.shape == x.shape and y.min() >= 0 and y.max() <= 1
    changed = (y - x).abs().flatten(1).amax(1) > 1e-6
    assert 0 < int(changed.sum()) < 64  # some samples drawn unchanged (p 0.8, gray 0.2), most changed
    # p = 0: identity factors (the HSV round trip of the hue step is exact to float32 rounding)
    torch.testing.assert_close(bt.random_color_jitter(x, p=0.0, grayscale_p=0.0), x, atol=1e-5, rtol=0)


@pytest.mark.parametrize("kernel", [3, 5, 9])
def test_batched_gaussian_blur_matches_torchvision(kernel: int) -> None:
    g = torch.Generator().manual_seed(2)
    x = torch.rand(4, 3, 12, 10, generator=g)
    sigma = torch.tensor([0.1, 0.7, 2.0, 0.0])  # 0: the sample is left unchanged (RandomApply not drawn)
    got = bt.batched_gaussian_blur(x, sigma, kernel)
    ref = torch.stack([TF.gaussian_blur(x[i], [kernel, kernel], [float(s), float(s)]) if s > 0 else x[i]
                       for i, s in enumerate(sigma)])
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)


def test_ema_update_formula_and_integer_buffers() -> None:
    online = [torch.tensor([1.0, 2.0]), torch.tensor(5)]
    target = [torch.tensor([3.0, 6.0]), torch.tensor(1)]
    bt.ema_update(online, target, beta=0.75)
    torch.testing.assert_close(target[0], torch.tensor([0.75 * 3 + 0.25 * 1, 0.75 * 6 + 0.25 * 2]))
    assert int(target[1]) == 5  # integer buffers (BatchNorm's num_batches_tracked) are copied


def test_registered_with_the_runner() -> None:
    assert "throughput" in ORDER and "throughput" in available()


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, Any]]:
    """One quick run (tiny sizes, CPU) of the whole benchmark; it must write no result files."""
    mp = pytest.MonkeyPatch()

    def no_write(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a quick run must not write results")

    mp.setattr(bt, "write_results", no_write)
    try:
        return bt.run(quick=True, device="cpu")
    finally:
        mp.undo()


@pytest.mark.slow
def test_smoke_run_every_method_trains_in_every_loop(smoke: tuple[str, dict[str, Any]]) -> None:
    md, data = smoke
    assert [c["method"] for c in data["steps"]] == list(bt.METHODS)
    for case in data["steps"]:
        assert "error" not in case, case
        impls = case["impls"]
        expected = {"ours", "plain"} | ({"lightly"} if case["method"] == "simclr" and "lightly" not in case else set())
        assert set(impls) == expected, (case["method"], set(impls))
        for name, res in impls.items():
            assert res["losses_finite"], (case["method"], name)
            assert res["losses_change"], (case["method"], name, res["losses_last_round"])  # the weights really moved
            ips = res["images_per_s"]
            assert ips["median"] > 0 and math.isfinite(ips["median"]) and ips["n"] == case["rounds"]
        assert 0 < case["ratio_ours_plain"] < math.inf
        assert 0 < case["paired_ratio_ours_plain"]["median"] < math.inf
        # ours and plain start from the same weights and compute the same loss on the same first batch
        assert case["first_loss_diff_ours_plain"] < 1e-4 * max(1.0, abs(case["first_loss"]["plain"])), case["first_loss"]
    simclr = next(c for c in data["steps"] if c["method"] == "simclr")
    assert ("ratio_ours_lightly" in simclr and simclr["ratio_ours_lightly"] > 0) or "not importable" in simclr["lightly"]
    assert "| SimCLR |" in md and "ours/plain" in md


@pytest.mark.slow
def test_smoke_run_pipeline_and_jitter_tables(smoke: tuple[str, dict[str, Any]]) -> None:
    md, data = smoke
    assert set(data["pipeline"]) == {"32"}
    rows = data["pipeline"]["32"]["pipelines"]
    assert set(rows) == set(bt.pipeline_specs())
    for r in rows.values():
        assert r["decode_ms"] > 0 and r["augment_ms"] > 0
        assert r["items_per_s_per_core"] == pytest.approx(1e3 / (r["decode_ms"] + r["augment_ms"]))
    # more views cost more than one view of the same image
    assert rows["relic_2_4"]["augment_ms"] > rows["relic_2"]["augment_ms"]
    jit = data["jitter"]["32"]
    assert jit["loader_us_per_image"] > 0 and jit["device_us_per_image"] > 0
    assert jit["loader_blur_us_per_image"] > 0 and jit["device_blur_us_per_image"] > 0 and jit["blur_kernel"] == 3
    assert "Data pipeline per loader core" in md and "Colour augmentation" in md


def test_a_time_budget_skips_what_does_not_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def fake_case(method: str, size: bt.StepSize, *args: Any, **kwargs: Any) -> dict[str, Any]:
        calls.append(method)
        return {"method": method, "size": bt.asdict(size), "error": "fake case"}

    monkeypatch.setattr(bt, "step_case", fake_case)
    monkeypatch.setattr(bt, "write_results", lambda *a, **k: None)
    # 10 s after the safety margin, 5 of them kept for the pipeline tables: 5 s for 7 cases of at least 1 s each
    md, data = bt.run(quick=True, device="cpu", budget_s=bt.BUDGET_SAFETY_S + 10.0)
    skipped = [c["method"] for c in data["steps"] if c["error"].startswith("skipped: time budget")]
    # the first case's share is 5/7 s, below the 1 s a quick case needs, whatever the timing; later ones may fit
    assert skipped[:1] == [bt.METHODS[0]], (skipped, calls)
    assert set(skipped).isdisjoint(calls) and len(skipped) + len(calls) == len(bt.METHODS)
    assert "Time budget" in md


def test_an_interrupt_keeps_what_was_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(method: str, size: bt.StepSize, *args: Any, **kwargs: Any) -> dict[str, Any]:
        raise SystemExit(1)  # what Lightning makes of a KeyboardInterrupt inside Trainer.fit

    written: list[str] = []
    monkeypatch.setattr(bt, "step_case", interrupted)
    monkeypatch.setattr(bt, "write_results", lambda name, md, data, cmd: written.append(md))
    md, data = bt.run(quick=False, device="cpu", methods=["ce", "cloc"])
    assert data["interrupted"] == "interrupted"
    assert [c["error"] for c in data["steps"]] == ["interrupted", "not run (interrupted)"]
    assert data["pipeline"] == {} and written == [md]  # the partial table is still written
