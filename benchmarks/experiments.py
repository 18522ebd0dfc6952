"""Reproducible experiment tables on real data: one command per table.

::

    python -m benchmarks.experiments utkface                 # seeds 0 1 2, CPU scale
    python -m benchmarks.experiments cifar10 --seeds 0 1 2
    python -m benchmarks.experiments utkface --quick --seeds 0 --rows ce    # smoke test (< 1 min)

Every cell of a table is a *row* (a method: one of the configs under ``configs/``
plus the command-line overrides held in :data:`TABLES`) run once per seed through
the real command line in a subprocess::

    python -m cloc_lightning fit --config <row config> <table scale overrides> <row overrides>
        --seed_everything S --data.seed S --trainer.logger CSVLogger ... [--test_after_fit true]

* **supervised** rows (UTKFace) are tested after fit on the best-validation
  checkpoint (``test_after_fit``); the test metrics are read from the run's
  ``metrics.csv`` (a :class:`~lightning.pytorch.loggers.CSVLogger` replaces the
  configs' TensorBoard logger, so the numbers are what Lightning logged).
* **pretrain** rows (CIFAR-10) train an encoder for the same number of epochs, then
  ``python -m cloc_lightning probe`` fits scikit-learn logistic regression on the
  frozen features of the final checkpoint (``last.ckpt``) and writes its JSON.
* **random** rows probe a randomly initialised encoder of the same architecture
  (seeded by the row's seed), written as a plain ``state_dict`` file.

Results are written after every run to ``<out>/<table>.md`` and ``<out>/<table>.json``
(mean ± sample standard deviation over the seeds that finished; the JSON holds every
run's command, metrics and wall time, the config files' text, the overrides, the
seeds, package versions and the git commit).  Finished runs keep a ``result.json`` in
their run folder (``--runs-dir``, default ``runs/experiments/<table>``) and are not
repeated when the command is run again (``--rerun`` repeats them), so an interrupted
table resumes where it stopped.  Checkpoints are deleted after a run has been read
unless ``--keep-checkpoints``.

The scale (image size, epochs, training-set fraction) is set in :data:`TABLES` for
2 shared CPU cores; see ``--help`` and the ``scale`` entry of each table.  Pass more
overrides to every row with ``--extra`` (e.g. ``--extra --trainer.max_epochs 30
--data.image_size 64 --trainer.accelerator gpu`` for a larger run).
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import importlib
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Literal, Sequence

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "benchmarks" / "results" / "experiments"
DEFAULT_DATA = Path(os.environ.get("CLOC_SHARED_DATA", REPO.parent / "shared" / "data"))

RowKind = Literal["supervised", "pretrain", "random"]

__all__ = ["Row", "Table", "TABLES", "run_table", "read_test_metrics", "aggregate", "format_mean_std", "main"]


@dataclass
class Row:
    """One method of a table.

    Attributes:
        key: short identifier (``--rows`` selects by it; the run folder's name).
        label: what the table prints.
        kind: ``supervised`` (test metrics of the fit), ``pretrain`` (fit, then offline
            probe of ``last.ckpt``) or ``random`` (probe of a random-init encoder).
        config: the YAML under ``configs/`` (``None`` for ``random``).
        overrides: command-line overrides after the table's scale overrides.
        column: which column group of the table the row belongs to (e.g. ``full`` /
            ``few-shot``).
        quick_overrides: extra overrides used only with ``--quick``.
        optional: skip (with the reason in the results) when ``config`` does not exist.
        probe_overrides: extra ``cloc-lightning probe`` arguments for this row.
    """

    key: str
    label: str
    kind: RowKind
    config: str | None
    overrides: list[str] = field(default_factory=list)
    column: str = "main"
    quick_overrides: list[str] = field(default_factory=list)
    optional: bool = False
    probe_overrides: list[str] = field(default_factory=list)


@dataclass
class Table:
    """A table: rows, the scale overrides shared by all rows, and how to print it."""

    name: str
    title: str
    data_subdir: str
    rows: list[Row]
    scale: list[str]
    quick_scale: list[str]
    metrics: list[tuple[str, str, str]]  # (metric key, header, format: 'pct' | 'f2' | 'f3')
    probe_config: str | None = None
    probe_overrides: list[str] = field(default_factory=list)
    quick_probe_overrides: list[str] = field(default_factory=list)
    random_backbone: str = "test_resnet"
    notes: str = ""


_QUIET = ["--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]

# --------------------------------------------------------------------- UTKFace
# 8 age groups (0-3, 4-7, 8-14, 15-24, 25-37, 38-47, 48-59, 60+) for every row, OrdinalCLIP
# included (its config's default is 80 age ranks; here it is told to use the same groups
# so that MAE/QWK are comparable).  ResNet-18 from scratch at 32 px, 20 % of the training
# split (~1,100 images), 3 epochs, validation once after the last epoch (so the tested
# checkpoint is the final one for every row); CLOC freezes its margins after 2 epochs
# (phase one = epochs 0-1, phase two = epoch 2), the configs' 10-of-15 ratio at this length.
_UTK_FREEZE = ["--trainer.callbacks", '[{"class_path": "cloc_lightning.callbacks.CLOCMarginFreeze", "init_args": {"freeze_at_epoch": 2}}]']
_UTK_FREEZE_QUICK = ["--trainer.callbacks", '[{"class_path": "cloc_lightning.callbacks.CLOCMarginFreeze", "init_args": {"freeze_at_epoch": 1}}]']
_CLIP_BINS = ["--data.label_mode", "bins", "--model.num_classes", "8"]
_FEW = ["--data.train_fraction", "0.1"]

UTKFACE = Table(
    name="utkface",
    title="UTKFace age groups (8 ordinal classes), ResNet-18 from scratch",
    data_subdir="utkface",
    rows=[
        Row("ce", "CE", "supervised", "configs/ce/utkface.yaml"),
        Row("cloc_mm", "CE + CLOC mm (two phases)", "supervised", "configs/cloc/utkface.yaml", _UTK_FREEZE,
            quick_overrides=_UTK_FREEZE_QUICK),
        Row("cloc_sm", "CE + CLOC sm (two phases)", "supervised", "configs/cloc/utkface_sm.yaml", _UTK_FREEZE,
            quick_overrides=_UTK_FREEZE_QUICK),
        Row("ordinal_clip", "OrdinalCLIP (random-init CLIP)", "supervised", "configs/ordinal_clip/utkface.yaml", _CLIP_BINS),
        Row("linear_head", "Linear head (OrdinalCLIP baseline)", "supervised", "configs/ordinal_clip/utkface_linear.yaml", _CLIP_BINS),
        Row("ce_few", "CE", "supervised", "configs/ce/utkface.yaml", _FEW, column="few-shot"),
        Row("cloc_mm_few", "CE + CLOC mm (two phases)", "supervised", "configs/cloc/utkface.yaml", _FEW + _UTK_FREEZE,
            column="few-shot", quick_overrides=_UTK_FREEZE_QUICK),
        Row("ordinal_clip_few", "OrdinalCLIP (random-init CLIP)", "supervised", "configs/ordinal_clip/utkface.yaml",
            _FEW + _CLIP_BINS, column="few-shot"),
        Row("linear_head_few", "Linear head (OrdinalCLIP baseline)", "supervised", "configs/ordinal_clip/utkface_linear.yaml",
            _FEW + _CLIP_BINS, column="few-shot"),
    ],
    scale=[
        "--data.image_size", "32",
        "--data.train_fraction", "0.2",
        "--data.eval_batch_size", "256",
        "--data.num_workers", "1",
        "--trainer.max_epochs", "3",
        "--trainer.check_val_every_n_epoch", "3",
        *_QUIET,
    ],
    quick_scale=[
        "--data.image_size", "32",
        "--data.few_shot", "8",
        "--data.batch_size", "16",
        "--data.eval_batch_size", "64",
        "--data.num_workers", "0",
        "--trainer.max_epochs", "2",
        "--trainer.limit_val_batches", "2",
        "--trainer.limit_test_batches", "2",
        *_QUIET,
    ],
    metrics=[("test/mae", "MAE ↓", "f3"), ("test/acc", "acc ↑", "pct"), ("test/qwk", "QWK ↑", "f3"), ("test/acc_pm1", "±1 acc ↑", "pct")],
    notes=(
        "MAE is in age-group units (arg-max class); accuracy, QWK (quadratic weighted kappa) and ±1 accuracy "
        "of the arg-max class, on the fixed 20 % hash test split (≈1,570 images), with the final checkpoint (validation runs once, after the last epoch). "
        "`main` rows train on 20 % of the training split, `few-shot` rows on 10 %."
    ),
)

# -------------------------------------------------------------------- CIFAR-10
# test_resnet (timm, 0.4 M parameters, 96-d features) at 32 px on 30 % of the 9,000
# training images (the other 1,000 are the validation hold-out), 3 epochs for every
# encoder; the probe fits on half of the training images (4,500, eval transform, same
# hash subset for every row) and scores the 10,000 test images.
CIFAR10 = Table(
    name="cifar10",
    title="CIFAR-10 linear probe of frozen encoders (test_resnet, 0.4 M parameters)",
    data_subdir="cifar10",
    rows=[
        Row("supcon", "SupCon", "pretrain", "configs/supcon/cifar10_cpu.yaml"),
        Row("simclr", "SimCLR", "pretrain", "configs/simclr/cifar10_cpu.yaml"),
        Row("ce", "CE end-to-end", "pretrain", "configs/ce/cifar10_cpu.yaml", ["--test_after_fit", "true"]),
        # gamma = 1 throughout vs the seed's cosine decay of gamma from 1 to 0 over the whole run
        # (3 epochs x 21 steps of 128 = 63 steps at this scale); the probe reads the EMA target
        # encoder's L2-normalised features, as the config's comment says
        Row("relic_fixed", "ReLIC-sigmoid, γ fixed", "pretrain", "configs/relic/cifar10_cpu.yaml",
            ["--model.use_gamma_scaling", "false"], optional=True, probe_overrides=["--normalize", "true"]),
        Row("relic_scheduled", "ReLIC-sigmoid, γ scheduled", "pretrain", "configs/relic/cifar10_cpu.yaml",
            ["--model.use_gamma_scaling", "true", "--model.gamma_scaling_steps", "63"], optional=True,
            quick_overrides=["--model.gamma_scaling_steps", "5"], probe_overrides=["--normalize", "true"]),
        Row("random", "Random-init encoder", "random", None),
    ],
    scale=[
        "--data.train_fraction", "0.3",
        "--data.num_workers", "1",
        "--trainer.max_epochs", "3",
        "--trainer.check_val_every_n_epoch", "3",
        *_QUIET,
    ],
    quick_scale=[
        "--data.few_shot", "16",
        "--data.batch_size", "32",
        "--data.num_workers", "0",
        "--trainer.max_epochs", "1",
        "--trainer.limit_val_batches", "2",
        "--trainer.limit_test_batches", "2",
        *_QUIET,
    ],
    metrics=[("probe/top1", "probe top-1 ↑", "pct"), ("probe/top5", "probe top-5 ↑", "pct"), ("test/acc", "end-to-end top-1", "pct")],
    probe_config="configs/linear_probe/probe_cifar10_cpu.yaml",
    probe_overrides=["--data.train_fraction", "0.5", "--data.num_workers", "1"],
    quick_probe_overrides=["--data.few_shot", "16", "--data.batch_size", "64", "--data.num_workers", "0", "--split", "val", "--max_iter", "100"],
    notes=(
        "Probe = scikit-learn LogisticRegression (C = 1, L-BFGS, standardised features) on the frozen backbone "
        "features of the final checkpoint, fit on 4,500 training images (a fixed hash half of the 9,000; eval "
        "transform), scored on the 10,000 test images. Encoders train on 2,700 images (30 %) for 3 epochs. `end-to-end top-1` is the CE model's own classifier on the test set."
    ),
)

TABLES: dict[str, Table] = {t.name: t for t in (UTKFACE, CIFAR10)}


# ------------------------------------------------------------------- helpers
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


def read_test_metrics(metrics_csv: Path, prefix: str = "test/") -> dict[str, float]:
    """The metrics starting with ``prefix`` from a CSVLogger ``metrics.csv`` (last non-empty value of each)."""
    if not metrics_csv.is_file():
        raise FileNotFoundError(f"{metrics_csv} does not exist: the run logged no metrics")
    out: dict[str, float] = {}
    with open(metrics_csv, newline="") as f:
        for row in csv.DictReader(f):
            for k, v in row.items():
                if k and k.startswith(prefix) and v not in (None, ""):
                    out[k] = float(v)
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


def _versions() -> dict[str, Any]:
    from benchmarks.harness import environment

    info = environment()
    for pkg in ("cloc_lightning", "sklearn", "torchmetrics", "jsonargparse", "numpy"):
        try:
            info[pkg] = importlib.import_module(pkg).__version__
        except Exception:  # noqa: BLE001 - optional
            info[pkg] = None
    try:
        info["git_commit"] = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10).stdout.strip() or None
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True, timeout=10).stdout
        info["git_dirty"] = bool(dirty.strip())
    except (OSError, subprocess.SubprocessError):
        info["git_commit"] = None
    return info


def _file_info(path: str | None) -> dict[str, Any] | None:
    if path is None:
        return None
    p = REPO / path
    if not p.is_file():
        return {"path": path, "exists": False}
    text = p.read_text()
    return {"path": path, "exists": True, "sha256": hashlib.sha256(text.encode()).hexdigest(), "text": text}


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONWARNINGS="ignore", HF_HUB_OFFLINE="1")
    env.setdefault("OMP_NUM_THREADS", "2")
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


#: run ``python -m cloc_lightning ...`` commands by calling :func:`cloc_lightning.cli.main` with the
#: same arguments in this process (saves the 10-90 s import of torch/lightning/timm/open_clip per
#: run on a busy machine); ``--subprocess`` starts a fresh interpreter per command instead.
IN_PROCESS = True


def _run_in_process(args: list[str], f: Any) -> int:
    import contextlib
    import gc
    import warnings

    from cloc_lightning.cli import main as cli_main

    rc = 0
    with contextlib.redirect_stdout(f), contextlib.redirect_stderr(f), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            cli_main(args)
        except SystemExit as e:  # argument errors exit
            rc = e.code if isinstance(e.code, int) else 1
        except Exception:  # noqa: BLE001 - recorded as a failed run
            import traceback

            traceback.print_exc(file=f)
            rc = 1
    gc.collect()
    return rc


def _run(cmd: list[str], log: Path, timeout: float) -> tuple[int, float]:
    """Run ``cmd`` in the repository root, appending its output to ``log``; return (returncode, wall seconds).

    ``python -m cloc_lightning ARGS`` runs in this process when :data:`IN_PROCESS` (no timeout there).
    """
    start = time.perf_counter()
    with open(log, "a") as f:
        f.write("$ " + " ".join(_quote(c) for c in cmd) + "\n")
        f.flush()
        if IN_PROCESS and cmd[1:3] == ["-m", "cloc_lightning"]:
            f.write("[experiments] in-process\n")
            f.flush()
            return _run_in_process(cmd[3:], f), time.perf_counter() - start
        try:
            proc = subprocess.run(cmd, cwd=REPO, env=_env(), stdout=f, stderr=subprocess.STDOUT, timeout=timeout)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            f.write(f"\n[experiments] timed out after {timeout:.0f} s\n")
            rc = 124
    return rc, time.perf_counter() - start


def _quote(s: str) -> str:
    return s if s and all(c.isalnum() or c in "-_./=:+,@" for c in s) else "'" + s.replace("'", "'\\''") + "'"


def _tail(path: Path, n: int = 2500) -> str:
    try:
        return path.read_text()[-n:]
    except OSError:
        return ""


def fit_command(table: Table, row: Row, seed: int, run_dir: Path, data_root: Path, quick: bool, extra: Sequence[str]) -> list[str]:
    """The ``python -m cloc_lightning fit`` command of one (row, seed)."""
    assert row.config is not None
    cmd = [sys.executable, "-m", "cloc_lightning", "fit", "--config", row.config]
    cmd += ["--data.root", str(data_root / table.data_subdir)]
    cmd += table.quick_scale if quick else table.scale
    cmd += row.overrides
    if quick:
        cmd += row.quick_overrides
    cmd += list(extra)
    cmd += ["--seed_everything", str(seed), "--data.seed", str(seed)]
    if row.kind == "supervised":
        cmd += ["--test_after_fit", "true"]
    cmd += [
        "--trainer.logger", "lightning.pytorch.loggers.CSVLogger",
        "--trainer.logger.save_dir", str(run_dir),
        "--trainer.logger.name", "",
        "--trainer.logger.version", "",
        "--trainer.default_root_dir", str(run_dir),
    ]
    return cmd


def probe_command(table: Table, ckpt: Path, out_json: Path, data_root: Path, quick: bool, seed: int, backbone: str | None = None,
                  row: Row | None = None) -> list[str]:
    """The ``python -m cloc_lightning probe`` command of one checkpoint."""
    assert table.probe_config is not None
    cmd = [sys.executable, "-m", "cloc_lightning", "probe", "--config", table.probe_config, "--ckpt", str(ckpt)]
    cmd += ["--data.root", str(data_root / table.data_subdir), "--data.seed", str(seed)]
    cmd += table.probe_overrides
    if quick:
        cmd += table.quick_probe_overrides
    if row is not None:
        cmd += row.probe_overrides
    if backbone is not None:
        cmd += ["--backbone", backbone]
    cmd += ["--output", str(out_json)]
    return cmd


def write_random_encoder(backbone: str, seed: int, path: Path) -> None:
    """A randomly initialised ``backbone`` (timm, seeded) saved as a plain ``state_dict``."""
    import torch

    from cloc_lightning.nn.backbones import create_backbone

    torch.manual_seed(seed)
    model, _ = create_backbone(backbone, False, False)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), path)


def _find_ckpt(run_dir: Path) -> Path | None:
    lasts = sorted(run_dir.rglob("last.ckpt"))
    return lasts[-1] if lasts else None


def run_one(table: Table, row: Row, seed: int, run_dir: Path, data_root: Path, quick: bool, extra: Sequence[str],
            timeout: float, keep_checkpoints: bool) -> dict[str, Any]:
    """Run one (row, seed); return its record (also written to ``run_dir/result.json``)."""
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    log = run_dir / "output.log"
    record: dict[str, Any] = {"row": row.key, "seed": seed, "run_dir": str(run_dir), "commands": [], "metrics": {}, "ok": False,
                              "mode": "in-process" if IN_PROCESS else "subprocess",
                              "started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())}
    start = time.perf_counter()
    try:
        if row.kind in ("supervised", "pretrain"):
            cmd = fit_command(table, row, seed, run_dir, data_root, quick, extra)
            record["commands"].append(cmd)
            rc, wall = _run(cmd, log, timeout)
            record["fit_wall_s"] = wall
            if rc != 0:
                raise RuntimeError(f"fit exited with {rc}")
            record["metrics"].update(read_test_metrics(run_dir / "metrics.csv") if (run_dir / "metrics.csv").is_file() else {})
            if row.kind == "supervised" and not record["metrics"]:
                raise RuntimeError("fit finished but logged no test/* metrics")
        if row.kind in ("pretrain", "random"):
            if row.kind == "random":
                ckpt = run_dir / "random_encoder.pt"
                write_random_encoder(table.random_backbone, seed, ckpt)
                backbone = table.random_backbone
            else:
                ckpt = _find_ckpt(run_dir)
                backbone = None
                if ckpt is None:
                    raise RuntimeError("fit wrote no last.ckpt to probe")
            out_json = run_dir / "probe.json"
            cmd = probe_command(table, ckpt, out_json, data_root, quick, seed, backbone, row)
            record["commands"].append(cmd)
            rc, wall = _run(cmd, log, timeout)
            record["probe_wall_s"] = wall
            if rc != 0 or not out_json.is_file():
                raise RuntimeError(f"probe exited with {rc}")
            probe = json.loads(out_json.read_text())
            record["probe"] = probe
            for k in ("top1", "top5", "train_top1"):
                if k in probe:
                    record["metrics"][f"probe/{k}"] = float(probe[k])
        record["ok"] = True
    except Exception as e:  # noqa: BLE001 - a failed run is recorded, the table goes on
        record["error"] = f"{type(e).__name__}: {e}"
        record["log_tail"] = _tail(log)
    record["wall_s"] = time.perf_counter() - start
    if not keep_checkpoints:
        for p in list(run_dir.rglob("*.ckpt")) + list(run_dir.rglob("random_encoder.pt")):
            p.unlink()
    (run_dir / "result.json").write_text(json.dumps(record, indent=2))
    return record


# -------------------------------------------------------------------- output
def render_markdown(table: Table, rows: list[Row], agg: dict[str, dict[str, Any]], command: str, seeds: list[int],
                    skipped: dict[str, str], env: dict[str, Any], runs: list[dict[str, Any]], quick: bool) -> str:
    from benchmarks.harness import markdown_table

    lines = [f"<!-- produced by: {command} -->", "", f"### {table.title}{' (QUICK smoke-test settings, not results)' if quick else ''}", ""]
    lines.append(f"Command: `{command}` — seeds {seeds}; mean ± sample std over the seeds that finished (n).")
    lines.append("")
    lines.append(f"Scale overrides (all rows): `{' '.join(_quote(s) for s in (table.quick_scale if quick else table.scale))}`")
    lines.append("")
    columns = list(dict.fromkeys(r.column for r in rows))
    for col in columns:
        col_rows = [r for r in rows if r.column == col]
        headers = ["method", "config + overrides"] + [h for _, h, _ in table.metrics] + ["n", "wall / run (s)"]
        body = []
        for r in col_rows:
            cfg = (r.config or f"random {table.random_backbone}") + (" " + " ".join(_quote(o) for o in r.overrides) if r.overrides else "")
            if r.probe_overrides:
                cfg += "`; probe `" + " ".join(_quote(o) for o in r.probe_overrides)
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
            body.append([r.label, f"`{cfg}`"] + cells + [str(len(a["seeds"])), f"{w['mean']:.0f} ({w['min']:.0f}–{w['max']:.0f})"])
        if len(columns) > 1:
            lines += [f"**{col}**", ""]
        lines += [markdown_table(headers, body), ""]
    lines.append(table.notes)
    lines.append("")
    failed = [x for x in runs if not x.get("ok")]
    if failed:
        lines.append("Failed runs: " + "; ".join(f"{x['row']} seed {x['seed']} ({x.get('error', '?')})" for x in failed))
        lines.append("")
    starts = sorted(r["started_utc"] for r in runs if r.get("ok") and r.get("started_utc"))
    when = f"runs started {starts[0]} – {starts[-1]} UTC" if starts else f"written {env.get('date')}"
    lines.append(
        f"Measured ({when}) on {env.get('cuda') or 'CPU'} ({env.get('cpu_count')} CPUs, shared), torch {env.get('torch')}, "
        f"lightning {env.get('lightning')}, timm {env.get('timm')}, open_clip {env.get('open_clip')}, "
        f"scikit-learn {env.get('sklearn')}, cloc_lightning {env.get('cloc_lightning')} @ {str(env.get('git_commit'))[:10]}"
        f"{' (+ uncommitted changes)' if env.get('git_dirty') else ''}. "
        f"Wall time = fit + test (+ probe) of one run ({_modes(runs)})."
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


def write_outputs(out: Path, table: Table, rows: list[Row], runs: list[dict[str, Any]], command: str, seeds: list[int],
                  skipped: dict[str, str], quick: bool, extra: Sequence[str], env: dict[str, Any]) -> Path:
    """Write ``<out>/<table>.md`` and ``.json``; return the markdown path."""
    out.mkdir(parents=True, exist_ok=True)
    agg = aggregate(runs)
    md = render_markdown(table, rows, agg, command, seeds, skipped, env, runs, quick)
    (out / f"{table.name}.md").write_text(md)
    payload = {
        "command": command,
        "table": table.name,
        "quick": quick,
        "seeds": seeds,
        "scale_overrides": table.quick_scale if quick else table.scale,
        "extra_overrides": list(extra),
        "probe": ({"config": _file_info(table.probe_config), "overrides": table.probe_overrides + (table.quick_probe_overrides if quick else [])}
                  if table.probe_config else None),
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


def _parse_deadline(value: str | None) -> float | None:
    """``HH:MM`` (UTC, today) or a full ISO time -> epoch seconds."""
    if not value:
        return None
    from datetime import datetime, timezone

    if len(value) <= 5 and ":" in value:
        hh, mm = (int(x) for x in value.split(":"))
        now = datetime.now(timezone.utc)
        return now.replace(hour=hh, minute=mm, second=0, microsecond=0).timestamp()
    dt = datetime.fromisoformat(value)
    return (dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)).timestamp()


def run_table(name: str, seeds: Sequence[int], quick: bool = False, out: Path = DEFAULT_OUT, runs_dir: Path | None = None,
              rows: Sequence[str] | None = None, data_root: Path = DEFAULT_DATA, extra: Sequence[str] = (), rerun: bool = False,
              timeout: float = 1800, keep_checkpoints: bool = False, command: str | None = None,
              deadline: str | None = None) -> dict[str, Any]:
    """Run (or resume) a table; write its markdown/JSON after every run; return the JSON payload.

    Rows not selected with ``rows`` still appear in the output with the finished runs
    cached in ``runs_dir`` (so a table can be filled by several invocations).  With
    ``deadline`` (``HH:MM`` UTC or ISO time) no run starts after it and a running one is
    stopped at it (recorded as failed).
    """
    if name not in TABLES:
        raise ValueError(f"unknown table {name!r}; choose from {sorted(TABLES)}")
    table = TABLES[name]
    if not (data_root / table.data_subdir).is_dir():
        raise FileNotFoundError(
            f"{table.name} needs the data at {data_root / table.data_subdir}; pass --data-root (or set CLOC_SHARED_DATA) "
            "to the folder holding utkface/ and cifar10/"
        )
    selected = [r for r in table.rows if rows is None or r.key in rows]
    stop_at = _parse_deadline(deadline)
    unknown = set(rows or []) - {r.key for r in table.rows}
    if unknown:
        raise ValueError(f"unknown rows {sorted(unknown)} for {name}; rows: {[r.key for r in table.rows]}")
    runs_dir = runs_dir or (REPO / "runs" / "experiments" / (name + ("_quick" if quick else "")))
    command = command or "python -m benchmarks.experiments " + " ".join(_quote(a) for a in sys.argv[1:])
    env = _versions()
    skipped: dict[str, str] = {}
    for r in table.rows:
        if r.optional and r.config and not (REPO / r.config).is_file():
            skipped[r.key] = f"{r.config} does not exist"
    runs: list[dict[str, Any]] = []
    for r in table.rows:  # finished runs of the rows this invocation does not run
        if r in selected or r.key in skipped:
            continue
        for seed in seeds:
            cached = runs_dir / r.key / f"seed{seed}" / "result.json"
            if cached.is_file():
                rec = json.loads(cached.read_text())
                if rec.get("ok"):
                    runs.append(rec)
    shown_rows = [r for r in table.rows if r in selected or any(x["row"] == r.key for x in runs)]
    # seeds outermost: every row gets seed 0 before any row gets seed 1, so a cut-short table is balanced
    for seed in seeds:
        for r in selected:
            if r.key in skipped:
                continue
            run_dir = runs_dir / r.key / f"seed{seed}"
            cached = run_dir / "result.json"
            if cached.is_file() and not rerun:
                rec = json.loads(cached.read_text())
                if rec.get("ok"):
                    runs.append(rec)
                    print(f"[experiments] {name}/{r.key} seed {seed}: cached ({rec['wall_s']:.0f} s)", flush=True)
                    continue
            limit = timeout
            if stop_at is not None:
                left = stop_at - time.time()
                same = [x["wall_s"] for x in runs if x.get("ok") and x["row"] == r.key] or [x["wall_s"] for x in runs if x.get("ok")]
                expected = statistics.fmean(same) if same else 60.0
                if left < expected:
                    print(f"[experiments] {name}/{r.key} seed {seed}: not started: {left:.0f} s to the deadline {deadline}, "
                          f"a run takes ~{expected:.0f} s", flush=True)
                    continue
                limit = min(timeout, left)
            print(f"[experiments] {name}/{r.key} seed {seed}: running ...", flush=True)
            rec = run_one(table, r, seed, run_dir, data_root, quick, extra, limit, keep_checkpoints)
            runs.append(rec)
            status = "ok" if rec["ok"] else f"FAILED ({rec.get('error')}); log: {run_dir / 'output.log'}"
            shown = {k: round(v, 4) for k, v in rec["metrics"].items() if any(k == m for m, _, _ in table.metrics)}
            print(f"[experiments] {name}/{r.key} seed {seed}: {status} in {rec['wall_s']:.0f} s {shown}", flush=True)
            write_outputs(out, table, shown_rows, runs, command, list(seeds), skipped, quick, extra, env)
    md = write_outputs(out, table, shown_rows, runs, command, list(seeds), skipped, quick, extra, env)
    print(md.read_text())
    return json.loads((out / f"{table.name}.json").read_text())


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.experiments", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("table", choices=sorted(TABLES))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--quick", action="store_true", help="tiny settings for a smoke test (numbers are not results)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where <table>.md and <table>.json go")
    parser.add_argument("--runs-dir", type=Path, default=None, help="run folders (default runs/experiments/<table>[_quick])")
    parser.add_argument("--rows", nargs="+", default=None, help="only these row keys")
    parser.add_argument("--data-root", type=Path, default=DEFAULT_DATA, help="folder holding utkface/ and cifar10/")
    parser.add_argument("--rerun", action="store_true", help="repeat runs that already have a result.json")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per subprocess")
    parser.add_argument("--keep-checkpoints", action="store_true")
    parser.add_argument("--subprocess", action="store_true", help="one fresh interpreter per command instead of in-process")
    parser.add_argument("--deadline", default=None, help="HH:MM (UTC) or ISO time: start no run after it, stop a running one at it")
    parser.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="overrides appended to every fit (must come last)")
    args = parser.parse_args(argv)
    global IN_PROCESS
    IN_PROCESS = not args.subprocess
    os.chdir(REPO)  # the configs' relative paths
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return run_table(args.table, args.seeds, args.quick, args.out, args.runs_dir, args.rows, args.data_root, args.extra,
                     args.rerun, args.timeout, args.keep_checkpoints, deadline=args.deadline)


if __name__ == "__main__":
    main()
