"""A table's outputs: ``<table>.md`` (markdown tables, paired differences, learning curves) and ``<table>.json``."""

from __future__ import annotations

import hashlib
import json
import statistics
import textwrap
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from experiments.paths import REPO
from experiments.stats import aggregate, format_mean_std, paired_differences, signed
from experiments.tables import Row, Table, source_file

__all__ = ["markdown_table", "quote", "code_summary", "render_markdown", "plot_curves", "write_outputs"]


def markdown_table(headers: list[str], rows: list[list[Any]]) -> str:
    """A GitHub markdown table; a ``|`` inside a cell (``max |grad|``) is escaped so it splits no cell."""

    def cell(c: Any) -> str:
        return str(c).replace("\\|", "|").replace("|", "\\|")

    lines = ["| " + " | ".join(cell(h) for h in headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def quote(s: str) -> str:
    """``s`` as a shell word (quoted where it has characters a shell would read)."""
    return s if s and all(c.isalnum() or c in "-_./=:+,@" for c in s) else "'" + s.replace("'", "'\\''") + "'"


def code_summary(runs: list[dict[str, Any]]) -> str:
    """The code the finished runs were made with, e.g. ``"`acc5030` (6 runs), `acc5030` + uncommitted changes (5 runs)"``."""
    counts: dict[str, int] = {}
    for r in runs:
        if not r.get("ok"):
            continue
        code = r.get("code") or {}
        commit = code.get("git_commit")
        key = "a tree not recorded" if not commit else f"`{commit[:7]}`" + (" + uncommitted changes" if code.get("git_dirty") else "")
        counts[key] = counts.get(key, 0) + 1
    order = sorted(counts, key=lambda k: (k == "a tree not recorded", -counts[k], k))
    return ", ".join(f"{k} ({counts[k]} run{'s' if counts[k] > 1 else ''})" for k in order)


def _file_info(path: str | None) -> dict[str, Any] | None:
    if path is None:
        return None
    p = REPO / path
    if not p.is_file():
        return {"path": path, "exists": False}
    text = p.read_text()
    return {"path": path, "exists": True, "sha256": hashlib.sha256(text.encode()).hexdigest(), "text": text}


def render_markdown(
    table: Table,
    rows: list[Row],
    agg: dict[str, dict[str, Any]],
    command: str,
    seeds: list[int],
    skipped: dict[str, str],
    env: dict[str, Any],
    runs: list[dict[str, Any]],
    quick: bool,
    extra: Sequence[str] = (),
    curves: str | None = None,
) -> str:
    lines = [f"<!-- produced by: {command} -->", "", f"### {table.title}{' (QUICK smoke-test settings, not results)' if quick else ''}", ""]
    lines.append(f"Command: `{command}` — seeds {seeds}; mean ± sample std over the seeds that finished (n).")
    lines.append("")
    lines.append(f"Scale overrides (all rows): `{' '.join(quote(s) for s in (table.quick_scale if quick else table.scale))}`")
    lines.append("")
    if extra:
        lines.append(
            f"Extra overrides of this invocation (all rows it ran, after the row overrides): `{' '.join(quote(s) for s in extra)}`"
        )
        lines.append("")
    lines.append(
        f"Every run's exact command line is in `{table.name}.json` (`runs[].commands`; `$RUNS` stands for the run folders' "
        "root `--runs-dir`, `$DATA` for `--data-root`, other paths are relative to the repository)."
    )
    lines.append("")
    columns = list(dict.fromkeys(r.column for r in rows))
    for col in columns:
        col_rows = [r for r in rows if r.column == col]
        headers = ["method", "config + overrides"] + [h for _, h, _ in table.metrics] + ["n", "wall / run (s)"]
        body = []
        for r in col_rows:
            cfg = (r.config or f"random {table.random_backbone}") + (" " + " ".join(quote(o) for o in r.overrides) if r.overrides else "")
            if r.init_from:
                cfg += f" --model.{r.init_arg} <{r.init_from}, same seed>/{source_file(r.init_arg)}"
            if r.probe_overrides:
                cfg += "`; probe `" + " ".join(quote(o) for o in r.probe_overrides)
            if r.key in skipped:
                body.append([r.label, f"`{cfg}`"] + ["–"] * len(table.metrics) + ["0", f"skipped: {skipped[r.key]}"])
                continue
            a = agg.get(r.key)
            if a is None:
                failed = [x for x in runs if x["row"] == r.key and not x.get("ok")]
                body.append([r.label, f"`{cfg}`"] + ["–"] * len(table.metrics) + ["0", "failed" if failed else "not run"])
                continue
            cells = [format_mean_std(a[m]["values"], fmt) if m in a else "–" for m, _, fmt in table.metrics]
            w = a["wall_s"]
            body.append([r.label, f"`{cfg}`", *cells, str(len(a["seeds"])), f"{w['mean']:.0f} ({w['min']:.0f}–{w['max']:.0f})"])
        if len(columns) > 1:
            lines += [f"**{col}**", ""]
        lines += [markdown_table(headers, body), ""]
        paired = [(r, b) for r in col_rows for b in r.baselines if r.key in agg and b in agg]
        if paired:
            test_metrics = [(m, h, fmt) for m, h, fmt in table.metrics if m.startswith(("test/", "probe/"))]
            p_body = []
            for r, key in paired:
                d = paired_differences(runs, r.key, key, [m for m, _, _ in test_metrics])
                b = next((x for x in rows if x.key == key), None)
                base = key if b is None else b.label + (f" ({b.column})" if b.column != r.column else "")
                n = max((v["n"] for v in d.values()), default=0)
                p_body.append(
                    [f"{r.label} − {base}"] + [signed(d[m]["values"], fmt) if m in d else "–" for m, _, fmt in test_metrics] + [str(n)]
                )
            lines += [f"Paired difference, same seed (row − baseline; mean ± sample std over seeds; {col}):", ""]
            lines += [markdown_table(["difference"] + [h for _, h, _ in test_metrics] + ["pairs"], p_body), ""]
    if curves:
        lines += [
            f"![learning curves]({curves})",
            "",
            f"Learning curves ({curves}): "
            + ", ".join(h for _, h in table.curve_metrics)
            + " after every epoch, mean over the seeds (line) ± sample std (band), drawn from the runs' own `metrics.csv`.",
            "",
        ]
    lines.append(table.notes)
    lines.append("")
    failed = [x for x in runs if not x.get("ok")]
    if failed:
        lines.append("Failed runs: " + "; ".join(f"{x['row']} seed {x['seed']} ({x.get('error', '?')})" for x in failed))
        lines.append("")
    starts = sorted(r["started_utc"] for r in runs if r.get("ok") and r.get("started_utc"))
    paused = [f"{r['row']} seed {r['seed']}: {r['paused_s']:.0f} s" for r in runs if r.get("ok") and r.get("paused_s")]
    restored = Counter(r["restored_from"]["file"] for r in runs if r.get("ok") and r.get("restored_from"))
    when = f"runs started {starts[0]} – {starts[-1]} UTC" if starts else f"written {env.get('date')}"
    lines.append(
        f"Measured ({when}) on {env.get('cuda') or 'CPU'} ({env.get('cpu_count')} CPUs, shared), torch {env.get('torch')}, "
        f"lightning {env.get('lightning')}, timm {env.get('timm')}, open_clip {env.get('open_clip')}, "
        f"scikit-learn {env.get('sklearn')}, cloc_lightning {env.get('cloc_lightning')}; "
        + (f"runs made with the code at {code_summary(runs)} (each run's `code` in `{table.name}.json`); " if starts else "")
        + f"rendered at `{str(env.get('git_commit'))[:7]}`{' + uncommitted changes' if env.get('git_dirty') else ''}. "
        f"Wall time = fit + test (+ probe) of one run ({_modes(runs)})"
        + (
            f"; the time {len(paused)} run(s) spent stopped (SIGSTOP) while another job used the machine, within the time "
            f"their wall counts, is taken out "
            f"({', '.join(paused)}; each run's `paused.json`)."
            if paused
            else "."
        )
        + (
            " Restored records (`--restore-runs`; runs made on an earlier machine, whose run folders are not here): "
            + ", ".join(f"{n} run(s) from `{f}`" for f, n in restored.items())
            + "."
            if restored
            else ""
        )
    )
    return "\n".join(lines) + "\n"


def _modes(runs: list[dict[str, Any]]) -> str:
    modes = {r.get("mode", "subprocess") for r in runs if r.get("ok")}
    parts = []
    if "subprocess" in modes:
        parts.append("subprocess runs include starting Python and importing torch/lightning/timm/open_clip")
    if "in-process" in modes:
        parts.append("in-process runs (`cloc_lightning.cli.main` called by the runner) exclude that start")
    return "; ".join(parts) or "no finished runs"


def plot_curves(table: Table, rows: list[Row], runs: list[dict[str, Any]], path: Path) -> str | None:
    """One figure: a panel per (column, curve metric), a line per row (mean over seeds ± sample std).

    Returns the file name, or ``None`` when no finished run logged a curve metric.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    have = {(x["row"]) for x in runs if x.get("ok") and x.get("curves")}
    if not have:
        return None
    # a panel row per column that has a run to draw (no empty panels for rows still to run)
    columns = list(dict.fromkeys(r.column for r in rows if r.key in have))
    width = max(5.2 * len(table.curve_metrics), 7.0)  # one panel: wide enough for the table's title
    fig, axes = plt.subplots(len(columns), len(table.curve_metrics), figsize=(width, 3.6 * len(columns)), squeeze=False)
    for i, col in enumerate(columns):
        for j, (metric, header) in enumerate(table.curve_metrics):
            ax = axes[i][j]
            for r in rows:
                if r.column != col:
                    continue
                per_seed = [
                    dict((int(e), v) for e, v in x["curves"].get(metric, []))
                    for x in runs
                    if x.get("ok") and x["row"] == r.key and x.get("curves")
                ]
                per_seed = [c for c in per_seed if c]
                if not per_seed:
                    continue
                epochs = sorted(set.intersection(*(set(c) for c in per_seed)))
                mean = [statistics.fmean(c[e] for c in per_seed) for e in epochs]
                ax.plot(epochs, mean, marker="o", markersize=3, label=f"{r.label} (n={len(per_seed)})")
                if len(per_seed) > 1:
                    std = [statistics.stdev([c[e] for c in per_seed]) for e in epochs]
                    ax.fill_between(
                        epochs, [m - s for m, s in zip(mean, std, strict=True)], [m + s for m, s in zip(mean, std, strict=True)], alpha=0.2
                    )
            ax.set_xlabel("epoch")
            ax.set_ylabel(header.split(" (")[0])  # the panel's title has the whole header
            ax.set_title(f"{col}: {header}" if len(columns) > 1 else header, fontsize=10)
            ax.grid(alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7)
    fig.suptitle("\n".join(textwrap.wrap(table.title, 120)), fontsize=10)  # a long title would be cut at the edges
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path.name


def write_outputs(
    out: Path,
    table: Table,
    rows: list[Row],
    runs: list[dict[str, Any]],
    command: str,
    seeds: list[int],
    skipped: dict[str, str],
    quick: bool,
    extra: Sequence[str],
    env: dict[str, Any],
) -> Path:
    """Write ``<out>/<table>.md`` and ``.json``; return the markdown path."""
    out.mkdir(parents=True, exist_ok=True)
    agg = aggregate(runs)
    for r in rows:  # "paired": {baseline key: {metric: differences}}
        bases = [b for b in r.baselines if r.key in agg and b in agg]
        if bases:
            agg[r.key]["paired_with"] = bases
            agg[r.key]["paired"] = {b: paired_differences(runs, r.key, b, [m for m, _, _ in table.metrics]) for b in bases}
    curves = plot_curves(table, rows, runs, out / f"{table.name}_curves.png") if table.curve_metrics else None
    md = render_markdown(table, rows, agg, command, seeds, skipped, env, runs, quick, extra, curves)
    (out / f"{table.name}.md").write_text(md)
    payload = {
        "command": command,
        "table": table.name,
        "quick": quick,
        "seeds": seeds,
        "scale_overrides": table.quick_scale if quick else table.scale,
        "extra_overrides": list(extra),
        "probe": (
            {"config": _file_info(table.probe_config), "overrides": table.probe_overrides + (table.quick_probe_overrides if quick else [])}
            if table.probe_config
            else None
        ),
        "rows": [
            {**{k: v for k, v in asdict(r).items() if k != "config"}, "config": _file_info(r.config), "skipped": skipped.get(r.key)}
            for r in rows
        ],
        "summary": agg,
        "runs": runs,
        "environment": env,
    }
    (out / f"{table.name}.json").write_text(json.dumps(payload, indent=2, default=str))
    return out / f"{table.name}.md"
