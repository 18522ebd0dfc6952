"""The sigmoid benchmark marks sections timed while other processes competed for the cores."""

from __future__ import annotations

from benchmarks.bench_sigmoid import _busy


def test_a_section_is_busy_when_the_load_exceeds_its_threads_by_more_than_a_core() -> None:
    assert not _busy([0.4, 1.3], threads=1)  # the benchmark's own thread
    assert not _busy([2.0, 2.9], threads=2)
    assert _busy([0.5, 2.4], threads=1)  # another process took the second core
    assert _busy([3.2, 1.0], threads=2)
    assert not _busy([None, None], threads=1)  # no load average on this platform: not marked
