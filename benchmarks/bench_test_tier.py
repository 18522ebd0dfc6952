"""The fast test tier's wall time, side by side with the tier of the day it was too slow (issue 51, item 6).

Run with ``python -m benchmarks.bench_test_tier`` (``--rounds N`` alternates the two tiers N times; ``--quick`` times
one test file of each, writes nothing).  The README's test command (``pytest -q -m "not slow"``) runs here and in a
temporary git worktree of :data:`REFERENCE` -- the checkout of 2026-11-29 whose tier took :data:`REFERENCE_SLOW_S`
seconds on the slow 2-core machine of issue 51 (one that ran the README's main job 2.5-3x slower than the machine
of 2026-11-29).  Both run on this machine, one after the other, so their ratio does not depend on the machine, and

    projected time on that slow machine = REFERENCE_SLOW_S x (this tier / the reference tier)

must stay under :data:`GOAL_S` (5 minutes).  Each tier runs in its own checkout (``python -m pytest`` from its root
puts that checkout's package first).  Measure on an idle machine; the load average is recorded.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import markdown_table, write_results

REPO = Path(__file__).resolve().parents[1]
#: the checkout of 2026-11-29 (issue 51 was filed on it) and its tier's time on the slow machine: 377 s, 1,833 tests
REFERENCE = "ad978c8"
REFERENCE_SLOW_S = 377.0
GOAL_S = 300.0
COMMAND = ["-m", "pytest", "-q", "-m", "not slow", "-p", "no:cacheprovider"]


def run_tier(root: Path, select: list[str] | None = None) -> dict[str, Any]:
    """The README's fast tier in the checkout ``root``: wall seconds, pytest's own seconds and the outcome counts."""
    env = {**os.environ, "PYTHONPATH": str(root), "HF_HUB_OFFLINE": "1"}
    load = round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, *COMMAND, *(select or [])], cwd=root, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    return {"wall_s": round(wall, 1), "load_before": load, **summary(proc.stdout)}


def summary(stdout: str) -> dict[str, Any]:
    """The counts and seconds of pytest's last line (``2066 passed, 34 skipped, ... in 171.36s``)."""
    last = next((ln for ln in reversed(stdout.strip().splitlines()) if re.search(r"\bin [0-9.]+s\b", ln)), "")
    counts = {k: int(v) for v, k in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)", last)}
    seconds = re.search(r"in ([0-9.]+)s", last)
    return {"counts": counts, "pytest_s": float(seconds.group(1)) if seconds else None, "last_line": last.strip("= ")}


def projected(current_s: float, reference_s: float) -> float:
    """This tier's time on the slow machine of issue 51, from the two tiers' times here."""
    return REFERENCE_SLOW_S * current_s / reference_s


def run(quick: bool = False, rounds: int = 1) -> tuple[str, dict[str, Any]]:
    select = ["tests/test_metrics.py"] if quick else None
    rows, data = [], {"reference": REFERENCE, "reference_slow_s": REFERENCE_SLOW_S, "goal_s": GOAL_S, "rounds": []}
    with tempfile.TemporaryDirectory() as tmp:
        ref = Path(tmp) / "reference"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(ref), REFERENCE], cwd=REPO, check=True)
        try:
            for i in range(rounds):
                pair = {"reference": run_tier(ref, select), "current": run_tier(REPO, select)}
                data["rounds"].append(pair)
                ratio = pair["current"]["wall_s"] / pair["reference"]["wall_s"]
                proj = projected(pair["current"]["wall_s"], pair["reference"]["wall_s"])
                for name in ("reference", "current"):
                    r = pair[name]
                    rows.append([str(i + 1), f"{name} ({REFERENCE if name == 'reference' else 'this checkout'})",
                                 f"{r['wall_s']:.0f}", r["last_line"], str(r["load_before"])])  # fmt: skip
                rows.append([str(i + 1), "**current / reference**", f"{ratio:.3f}", f"projected on the slow machine: {proj:.0f} s", ""])
                pair["ratio"], pair["projected_slow_s"] = ratio, proj
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(ref)], cwd=REPO, check=False)
    worst = max(p["projected_slow_s"] for p in data["rounds"])
    verdict = "smoke run (times one file)" if quick else ("met" if worst <= GOAL_S else "NOT met")
    data["worst_projected_slow_s"], data["verdict"] = worst, verdict
    md = (
        f'### The fast tier (`pytest -q -m "not slow"`), this checkout and {REFERENCE} side by side\n\n'
        f"{REFERENCE}'s tier took {REFERENCE_SLOW_S:.0f} s on the slow machine of issue 51; this tier's projected time there "
        f"is {REFERENCE_SLOW_S:.0f} s x (current / reference), the goal {GOAL_S:.0f} s.\n\n"
        f"{markdown_table(['round', 'tier', 'wall s', 'pytest', '1-min load before'], rows)}\n\n"
        f"Worst projected time on the slow machine: **{worst:.0f} s** (goal <= {GOAL_S:.0f} s): {verdict}.\n"
    )
    if not quick:
        write_results("test_tier", md, data, "python -m benchmarks.bench_test_tier")
    return md, data


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one test file of each tier (smoke run, writes nothing)")
    parser.add_argument("--rounds", type=int, default=1, help="reference/current pairs to time (default 1)")
    args = parser.parse_args()
    print(run(quick=args.quick, rounds=args.rounds)[0])
