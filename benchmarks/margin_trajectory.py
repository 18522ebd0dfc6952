"""Plot CLOC's learned margins over training from runs' CSVLogger ``metrics.csv`` files.

Every CLOC run logs ``margins/C{i}-C{i+1}`` every ``log_margins_every_n_steps`` steps;
this script draws one panel per run (a line per adjacent class pair, the freeze epoch
marked) and writes a Markdown table of the margins at the freeze and at the end::

    python -m benchmarks.margin_trajectory \\
        --run "margin_lr = lr (seed)=runs/experiments/utkface_shipped/cloc_mm/seed0/metrics.csv" \\
        --run "margin_lr = 0.01=runs/experiments/utkface_shipped_margin_lr_0.01/cloc_mm/seed0/metrics.csv" \\
        --freeze-epoch 10 --out benchmarks/results/experiments/shipped_scale/cloc_margins
"""

from __future__ import annotations

import argparse
import csv
import math
from pathlib import Path
from typing import Any

__all__ = ["read_margins", "main"]


def read_margins(metrics_csv: Path) -> dict[str, Any]:
    """``{"names": [...], "step": [...], "epoch": [...], "values": {name: [...]}}`` of the margin rows."""
    with open(metrics_csv, newline="") as f:
        rows = list(csv.DictReader(f))
    names = [c for c in (rows[0].keys() if rows else []) if c.startswith("margins/")]
    if not names:
        raise ValueError(f"{metrics_csv} has no margins/* columns: is it a CLOC run's metrics.csv?")
    out: dict[str, Any] = {"names": names, "step": [], "epoch": [], "values": {n: [] for n in names}}
    for r in rows:
        if not r.get(names[0]):
            continue
        out["step"].append(int(float(r["step"])))
        out["epoch"].append(int(float(r["epoch"])) if r.get("epoch") else -1)
        for n in names:
            out["values"][n].append(float(r[n]))
    if not out["step"]:
        raise ValueError(f"{metrics_csv} has margins/* columns but no logged values")
    return out


def _at_freeze(m: dict[str, Any], freeze_epoch: int | None) -> dict[str, float]:
    """Margins logged last before the first step of ``freeze_epoch`` (the values phase two keeps)."""
    idx = len(m["step"]) - 1
    if freeze_epoch is not None:
        before = [i for i, e in enumerate(m["epoch"]) if 0 <= e < freeze_epoch]
        idx = before[-1] if before else 0
    return {n: m["values"][n][idx] for n in m["names"]}


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", action="append", required=True, help="LABEL=path/to/metrics.csv (repeatable)")
    p.add_argument("--freeze-epoch", type=int, default=None, help="epoch at which CLOCMarginFreeze fixed the margins")
    p.add_argument("--out", type=Path, required=True, help="output path without suffix (.png and .md are written)")
    args = p.parse_args(argv)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs: list[tuple[str, dict[str, Any]]] = []
    for spec in args.run:
        label, sep, path = spec.rpartition("=")
        if not sep or not label:
            raise SystemExit(f"--run takes LABEL=path/to/metrics.csv, got {spec!r}")
        runs.append((label, read_margins(Path(path))))

    fig, axes = plt.subplots(1, len(runs), figsize=(5.5 * len(runs), 3.8), sharey=True, squeeze=False)
    for ax, (label, m) in zip(axes[0], runs, strict=True):
        for n in m["names"]:
            ax.plot(m["step"], m["values"][n], label=n.split("/", 1)[1], linewidth=1.2)
        if args.freeze_epoch is not None:
            first = [s for s, e in zip(m["step"], m["epoch"], strict=True) if e >= args.freeze_epoch]
            if first:
                ax.axvline(first[0], color="k", linestyle="--", linewidth=0.8)
                ax.text(first[0], ax.get_ylim()[1], " freeze", va="top", fontsize=8)
        ax.set_title(label, fontsize=10)
        ax.set_xlabel("optimiser step")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("margin between adjacent classes")
    axes[0][-1].legend(fontsize=7, ncol=2, loc="best")
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    png = args.out.with_suffix(".png")
    fig.savefig(png, dpi=120)
    plt.close(fig)

    names = runs[0][1]["names"]
    short = [n.split("/", 1)[1] for n in names]
    lines = [
        f"Margins when first logged and at the freeze (last value logged before epoch {args.freeze_epoch}):",
        "",
        "| run | when | " + " | ".join(short) + " | mean |",
        "|---|---|" + "---|" * (len(short) + 1),
    ]
    for label, m in runs:
        start = {n: m["values"][n][0] for n in m["names"]}
        frozen = _at_freeze(m, args.freeze_epoch)
        for when, vals in ((f"step {m['step'][0]} (first logged)", start), ("freeze", frozen)):
            row = [vals.get(n, math.nan) for n in names]
            lines.append(f"| {label} | {when} | " + " | ".join(f"{v:.3f}" for v in row) + f" | {sum(row) / len(row):.3f} |")
    md = "\n".join(lines) + f"\n\n![margin trajectories]({png.name})\n"
    args.out.with_suffix(".md").write_text(md)
    print(md)
    return md


if __name__ == "__main__":
    main()
