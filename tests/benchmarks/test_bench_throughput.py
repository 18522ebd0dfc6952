"""benchmarks/bench_throughput.py: the EMA update and a smoke run (its device-side colour jitter and blur are the data
path's ``DeviceAugment``, tested against torchvision in tests/data/test_device_augment.py).

No timing is asserted: the smoke run checks the structure and that every loop really trained.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from benchmarks import bench_throughput as bt
from benchmarks.__main__ import ORDER, available


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
    assert jit["device_plain_us_per_image"] > 0
    assert "Data pipeline per loader core" in md and "Colour augmentation" in md


@pytest.mark.slow  # times real benchmark cases: the long tier (pytest -m slow)
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
