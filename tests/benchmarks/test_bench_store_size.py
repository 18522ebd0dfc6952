"""``benchmarks/bench_store_size.py`` in its quick form: smaller stores lose more gradient energy, the originals' size none.

Marked ``slow`` (about a minute); needs the UTKFace faces of ``../shared/data``.
"""

from __future__ import annotations

import itertools

import pytest

from tests.conftest import UTKFACE

pytestmark = pytest.mark.slow


@pytest.mark.skipif(not UTKFACE.is_dir(), reason=f"needs the UTKFace faces in {UTKFACE} (../shared/data; see its README)")
def test_smaller_stores_are_blurrier_and_the_originals_size_is_lossless() -> None:
    from benchmarks.bench_store_size import run

    _, data = run(quick=True)
    rows = data["rows"]
    loader = {r["S"]: r["loss_pct"] for r in rows if r["path"] == "loader" and r["pipeline"] == "resolution" and r["S"] is not None}
    sizes = sorted(loader)
    assert len(sizes) >= 3, loader
    assert all(loader[a] >= loader[b] - 2 for a, b in itertools.pairwise(sizes)), loader  # smaller stores lose more
    assert loader[min(sizes)] > 30 and abs(loader[max(sizes)]) < 2, loader  # 32 px: a third or more; the originals' size: nothing
