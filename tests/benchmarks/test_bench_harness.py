"""benchmarks/harness.py peak memory against known allocations; the ``python -m benchmarks`` runner."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from benchmarks.__main__ import available, combined_readme, main
from benchmarks.harness import MEMORY_METHOD_ENV, memory_method, peak_memory_mb

MIB = 2**20
CASE = "benchmarks.harness:known_allocation_case"


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the RSS high-water-mark method is Linux-only")
def test_peak_rss_of_a_known_allocation_from_a_large_parent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MEMORY_METHOD_ENV, raising=False)
    assert memory_method() == "rss"
    # a large calling process: ru_maxrss-based measurements in the child reported ~this size instead
    ballast = torch.ones(400 * MIB // 4) + 1
    mem = peak_memory_mb(CASE, {"mib": 96})
    assert 96 <= mem < 96 + 12, mem  # the tensor plus a little interpreter/allocator noise
    # an allocation freed before the peak counts at its own size: the peak is the larger one
    mem2 = peak_memory_mb(CASE, {"mib": 48, "free_first": True})
    assert 96 <= mem2 < 96 + 12, mem2
    del ballast


@pytest.mark.slow
def test_torch_allocator_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MEMORY_METHOD_ENV, "torch")
    assert memory_method() == "torch"
    mem = peak_memory_mb(CASE, {"mib": 48, "free_first": True})
    assert mem == pytest.approx(96, abs=0.01)  # tensor memory only: exact


def test_memory_method_rejects_unknown_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MEMORY_METHOD_ENV, "tracemalloc")
    with pytest.raises(ValueError, match="must be 'rss' or 'torch'"):
        memory_method()
    assert memory_method("cuda") == "cuda"


def test_runner_lists_selects_and_combines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    names = available()
    assert names[:2] == ["cloc", "supcon"] and "lightning_overhead" in names
    assert main(["--list"]) == 0
    assert "lightning_overhead" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="unknown benchmark.*nope.*available: cloc"):
        main(["--only", "nope"])
    out = tmp_path / "README.md"
    assert main(["--combine", "--out", str(out)]) == 0
    text = out.read_text()
    assert text.startswith("<!-- produced by: python -m benchmarks --combine -->")
    assert "## Environment of this run" in text and "| torch |" in text
    for n in names:
        assert f'<a id="{n.replace("_", "-")}"></a>' in text or "never measured" in text
    md = combined_readme(
        "python -m benchmarks",
        {"cloc": "<!-- produced by: python -m benchmarks.bench_cloc -->\n\n# T\n\n| a |\n|---|"},
        {"cloc": "measured now (1 s)"},
    )
    assert "Command: `python -m benchmarks.bench_cloc`" in md and "\n## T" in md and "| [cloc](#cloc) |" in md
