"""benchmarks.margin_trajectory reads CLOC margins from CSVLogger files and picks the frozen values."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import margin_trajectory


def _write(path: Path) -> None:
    lines = ["epoch,step,margins/C0-C1,margins/C1-C2,train/loss"]
    for step in range(0, 40, 5):
        epoch = step // 10
        lines.append(f"{epoch},{step},{1.0 - step / 100},{0.5 + step / 100},")
        lines.append(f"{epoch},{step},,,0.3")  # a row of other metrics
    path.write_text("\n".join(lines) + "\n")


def test_margins_at_freeze_and_plot(tmp_path: Path) -> None:
    _write(tmp_path / "metrics.csv")
    m = margin_trajectory.read_margins(tmp_path / "metrics.csv")
    assert m["names"] == ["margins/C0-C1", "margins/C1-C2"] and len(m["step"]) == 8
    md = margin_trajectory.main(["--run", f"a=b={tmp_path / 'metrics.csv'}", "--freeze-epoch", "2", "--out", str(tmp_path / "m")])
    # last value logged before epoch 2 is at step 15: 0.85 and 0.65
    assert "| a=b | freeze | 0.850 | 0.650 | 0.750 |" in md
    assert "| a=b | step 0 (first logged) | 1.000 | 0.500 | 0.750 |" in md
    assert (tmp_path / "m.png").stat().st_size > 1000


def test_not_a_cloc_run(tmp_path: Path) -> None:
    (tmp_path / "metrics.csv").write_text("epoch,step,train/loss\n0,1,0.5\n")
    with pytest.raises(ValueError, match="no margins"):
        margin_trajectory.read_margins(tmp_path / "metrics.csv")
