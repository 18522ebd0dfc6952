"""The sigmoid benchmark marks sections timed while other processes competed for the cores."""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest

from benchmarks import bench_sigmoid
from benchmarks.bench_sigmoid import _busy, _busy_jiffies, _OtherCPU


def test_a_section_is_busy_when_other_processes_use_a_quarter_core() -> None:
    assert not _busy(0.05, [3.0, 3.0], threads=1)  # measured: the lagging load average is not used
    assert _busy(0.6, [0.2, 0.3], threads=2)
    # no /proc/stat: a 1-min load average above the section's threads + 1
    assert not _busy(None, [0.4, 1.3], threads=1)
    assert _busy(None, [0.5, 2.4], threads=1)
    assert not _busy(None, [None, None], threads=1)


def test_other_cpu_is_the_machine_busy_time_less_this_process(monkeypatch: pytest.MonkeyPatch) -> None:
    tick = os.sysconf("SC_CLK_TCK")
    clock = {"wall": 10.0, "own": 1.0, "jiffies": 1000}
    monkeypatch.setattr(bench_sigmoid, "_busy_jiffies", lambda: clock["jiffies"])
    monkeypatch.setattr(bench_sigmoid.time, "perf_counter", lambda: clock["wall"])
    monkeypatch.setattr(bench_sigmoid.os, "times", lambda: (clock["own"], 0.0, 0.0, 0.0, 0.0))
    meter = _OtherCPU()
    meter.start()
    # 2 s of wall time: this process used 2 s of CPU, the machine 3 s: others kept half a core busy
    clock.update(wall=12.0, own=3.0, jiffies=1000 + 3 * tick)
    assert meter.stop() == pytest.approx(0.5)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/stat is Linux's")
def test_busy_jiffies_reads_proc_stat() -> None:
    first: Any = _busy_jiffies()
    assert isinstance(first, int) and first > 0
