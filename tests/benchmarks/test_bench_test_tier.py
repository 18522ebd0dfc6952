"""The fast-tier benchmark reads pytest's summary line and projects the tier's time onto the slow machine of issue 51."""

from __future__ import annotations

import pytest

from benchmarks.bench_test_tier import REFERENCE_SLOW_S, projected, summary


def test_the_summary_line_gives_counts_and_seconds() -> None:
    out = "....\n=== 2066 passed, 34 skipped, 465 deselected, 224 warnings in 171.36s (0:02:51) ===\n"
    got = summary(out)
    assert got["counts"] == {"passed": 2066, "skipped": 34, "deselected": 465}
    assert got["pytest_s"] == 171.36
    assert summary("no summary")["pytest_s"] is None


def test_the_projection_scales_the_reference_tiers_slow_time_by_the_ratio_measured_here() -> None:
    assert projected(100.0, 200.0) == pytest.approx(REFERENCE_SLOW_S / 2)
    assert projected(200.0, 200.0) == pytest.approx(REFERENCE_SLOW_S)
