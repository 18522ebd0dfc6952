"""Statistics over a table's runs: mean ± sample standard deviation per row, and paired differences by seed."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["format_mean_std", "signed", "aggregate", "paired_differences"]


def format_mean_std(values: Sequence[float], fmt: str) -> str:
    """``mean ± std`` (sample std, ddof 1) of ``values`` in a table format; ``n=1`` has no ``±``."""
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not vals:
        return "–"
    scale, digits = {"pct": (100.0, 1), "f2": (1.0, 2), "f3": (1.0, 3)}[fmt]
    mean = statistics.fmean(vals) * scale
    if len(vals) == 1:
        return f"{mean:.{digits}f}"
    std = statistics.stdev(vals) * scale
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


def signed(values: Sequence[float], fmt: str) -> str:
    """:func:`format_mean_std` with the sign always written (a difference)."""
    text = format_mean_std(values, fmt)
    return text if text.startswith("-") or text == "–" else "+" + text


def paired_differences(runs: Iterable[dict[str, Any]], row: str, baseline: str, metrics: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Per metric: ``row − baseline`` of the seeds both finished (``mean``, ``std`` (sample), ``n``, ``values``, ``seeds``)."""
    by_seed: dict[str, dict[int, dict[str, float]]] = {row: {}, baseline: {}}
    for r in runs:
        if r.get("ok") and r["row"] in by_seed:
            by_seed[r["row"]][r["seed"]] = r["metrics"]
    seeds = sorted(set(by_seed[row]) & set(by_seed[baseline]))
    out: dict[str, dict[str, Any]] = {}
    for m in metrics:
        pairs = [(s, by_seed[row][s][m] - by_seed[baseline][s][m]) for s in seeds if m in by_seed[row][s] and m in by_seed[baseline][s]]
        vals = [d for _, d in pairs]
        if vals:
            out[m] = {
                "mean": statistics.fmean(vals),
                "std": statistics.stdev(vals) if len(vals) > 1 else float("nan"),
                "n": len(vals),
                "values": vals,
                "seeds": [s for s, _ in pairs],
            }
    return out


def aggregate(runs: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per row key: ``{metric: {'mean', 'std', 'n', 'values'}}`` plus wall-time statistics, over successful runs."""
    grouped: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        if r.get("ok"):
            grouped.setdefault(r["row"], []).append(r)
    out: dict[str, dict[str, Any]] = {}
    for key, rs in grouped.items():
        entry: dict[str, Any] = {"seeds": sorted(r["seed"] for r in rs)}
        names = sorted({m for r in rs for m in r["metrics"]})
        for m in names:
            vals = [r["metrics"][m] for r in rs if m in r["metrics"] and math.isfinite(r["metrics"][m])]
            entry[m] = {
                "mean": statistics.fmean(vals) if vals else float("nan"),
                "std": statistics.stdev(vals) if len(vals) > 1 else float("nan"),
                "n": len(vals),
                "values": vals,
            }
        walls = [r["wall_s"] for r in rs]
        entry["wall_s"] = {"mean": statistics.fmean(walls), "min": min(walls), "max": max(walls), "values": walls}
        out[key] = entry
    return out
