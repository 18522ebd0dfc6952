"""Seed fidelity of SupCon / SimCLR / the linear stage to HobbitLong/SupContrast (issue 14).

The references below are written here from the *behaviour* of the seed
(github.com/HobbitLong/SupContrast): ``losses.py`` (``SupConLoss(temperature=0.07,
base_temperature=0.07)``: per anchor ``-(T / T_b) * mean over positives of log
softmax``, self excluded), ``util.py`` + ``main_supcon.py`` / ``main_ce.py`` /
``main_linear.py`` (learning rate per epoch, ``--warm`` per step) and the README's
CIFAR-10 commands.  They share no code with the library; the schedule reference is a
loop over the seed's epochs and batches, the loss reference a loop over anchors in
float64.  The shared schedule and initialisation themselves are tested in
``tests/fidelity/test_fidelity_schedule.py``.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import lightning as L
import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader, TensorDataset
from torchvision.transforms import v2

from cloc_lightning.data import CIFAR10DataModule, ImageFolderDataModule, OrdinalShapesDataModule
from cloc_lightning.data.errors import DataConfigError
from cloc_lightning.losses.supcon import SupConLoss, supcon_loss
from cloc_lightning.methods import CEModule, LinearProbeModule, SupConModule
from cloc_lightning.nn.backbones import create_backbone
from tests.conftest import REPO, TINY_BACKBONE, cpu_trainer, linked_model_args
from tests.references.schedules import supcontrast_lrs  # the seed's per-step learning rates
from tests.references.supcon import supcon_loop_reference  # the seed's SupConLoss (SupContrast, PR #142)


# =============================================================================================
# 1. the loss: base_temperature 0.07 as the seed
# =============================================================================================
def _feats(b: int = 8, v: int = 2, d: int = 16, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return F.normalize(torch.randn(b, v, d, generator=g, dtype=torch.float64), dim=-1)


LABELS = torch.tensor([0, 1, 0, 2, 1, 0, 3, 2])


@pytest.mark.parametrize("method", ["supcon", "simclr"])
@pytest.mark.parametrize("temperature", [0.05, 0.07, 0.1, 0.5])
def test_loss_defaults_are_the_seeds(temperature: float, method: str) -> None:
    """``SupConLoss(temperature=T)`` (and ``supcon_loss``) = the seed's ``SupConLoss(temperature=T)``: T_b = 0.07."""
    f = _feats()
    y = LABELS if method == "supcon" else None
    ref = float(supcon_loop_reference(f, y, temperature=temperature))
    assert float(SupConLoss(temperature=temperature)(f, y)) == pytest.approx(ref, rel=1e-10)
    assert float(supcon_loss(f, y, temperature=temperature)) == pytest.approx(ref, rel=1e-10)
    assert float(SupConLoss(temperature, "one")(f, y)) == pytest.approx(
        float(supcon_loop_reference(f, y, temperature=temperature, contrast_mode="one")), rel=1e-10
    )


def test_loss_without_arguments_is_the_seeds_default() -> None:
    f = _feats(seed=1)
    assert float(SupConLoss()(f, LABELS)) == pytest.approx(float(supcon_loop_reference(f, LABELS)), rel=1e-10)
    assert SupConLoss().base_temperature == 0.07


@pytest.mark.parametrize("temperature,factor", [(0.1, 0.1 / 0.07), (0.5, 0.5 / 0.07)])
def test_tied_base_temperature_is_the_explicit_unscaled_choice(temperature: float, factor: float) -> None:
    """``base_temperature=None`` ties T_b to T (the plain loss); the default is T / 0.07 times it (1.43x, 7.1x)."""
    f = _feats(seed=2)
    plain = float(supcon_loop_reference(f, LABELS, temperature=temperature, base_temperature=temperature))
    tied = SupConLoss(temperature, base_temperature=None)
    assert tied.base_temperature is None and "base_temperature=None" in repr(tied)
    assert float(tied(f, LABELS)) == pytest.approx(plain, rel=1e-10)
    assert float(SupConLoss(temperature)(f, LABELS)) == pytest.approx(plain * factor, rel=1e-10)


@pytest.mark.parametrize("method,temperature", [("supcon", 0.1), ("simclr", 0.5)])
def test_supcon_module_uses_the_seeds_loss_scaling(method: str, temperature: float) -> None:
    """SupConModule's default criterion is the seed's loss at the README temperature (0.1 / 0.5, T_b 0.07)."""
    m = SupConModule(method=method, backbone=TINY_BACKBONE, online_probe=False)
    assert m.hparams.base_temperature == 0.07 and m.criterion.base_temperature == 0.07
    f = _feats(seed=3)
    y = LABELS if method == "supcon" else None
    ref = float(supcon_loop_reference(f, y, temperature=temperature))
    assert float(m.criterion(f, y)) == pytest.approx(ref, rel=1e-10)
    tied = SupConModule(method=method, backbone=TINY_BACKBONE, online_probe=False, base_temperature=None)
    assert tied.criterion.base_temperature is None  # (also what checkpoints of older versions stored)


# =============================================================================================
# 2. the paper configs against the seed's commands
# =============================================================================================
def _config(rel: str) -> dict[str, Any]:
    return yaml.safe_load((REPO / "configs" / rel).read_text())


#: the seed's settings (README command + argparse defaults of the script)
SEED_PRETRAIN = {
    "supcon/cifar10.yaml": dict(method="supcon", temperature=0.1, lr=0.5, epochs=1000, batch=1024),  # main_supcon.py
    "simclr/cifar10.yaml": dict(method="simclr", temperature=0.5, lr=0.5, epochs=1000, batch=1024),  # --method SimCLR
}
SEED_CIFAR10_MEAN, SEED_CIFAR10_STD = [0.4914, 0.4822, 0.4465], [0.2023, 0.1994, 0.2010]


@pytest.mark.parametrize("rel", sorted(SEED_PRETRAIN))
def test_pretraining_configs_state_the_seeds_settings(rel: str) -> None:
    seed = SEED_PRETRAIN[rel]
    cfg = _config(rel)
    m, d = cfg["model"]["init_args"], cfg["data"]["init_args"]
    assert cfg["trainer"]["max_epochs"] == seed["epochs"] and d["batch_size"] == seed["batch"]
    assert m["method"] == seed["method"] and m["temperature"] == seed["temperature"]
    assert m.get("base_temperature", 0.07) == 0.07 and m.get("contrast_mode", "all") == "all"
    assert m["lr"] == seed["lr"] and m["optimizer"] == "sgd" and m["momentum"] == 0.9 and m["weight_decay"] == 1e-4
    # --cosine, and --warm (switched on by batch_size > 256): 10 epochs from 0.01, eta_min = lr * 0.1**3
    assert m["scheduler"] == "cosine" and m["lr_interval"] == "epoch"
    assert m["warmup_epochs"] == 10 and m["warmup_from"] == 0.01 and m["min_lr_ratio"] == pytest.approx(1e-3)
    # SupConResNet: resnet50 with a 3x3 stem, kaiming init, mlp head d -> d -> 128
    assert m["backbone"] == "resnet50" and m["cifar_stem"] is True and m["backbone_init"] == "kaiming"
    assert m["projector_dim"] == 128 and m.get("projector_hidden_dim") is None and m["n_views"] == 2
    # set_loader: the CIFAR-10 normalisation and the two-crop augmentation
    assert d["mean"] == SEED_CIFAR10_MEAN and d["std"] == SEED_CIFAR10_STD and d.get("drop_last") is False
    views = d["train_views"]["init_args"]
    assert views["scale"] == [0.2, 1.0] and views["jitter"] == [0.4, 0.4, 0.4, 0.1]
    assert views["jitter_p"] == 0.8 and views["grayscale_p"] == 0.2


def test_supervised_and_linear_configs_state_the_seeds_settings() -> None:
    ce = _config("ce/cifar10.yaml")  # main_ce.py + README: batch 1024, lr 0.8, --cosine (--warm by batch size)
    m, d = ce["model"]["init_args"], ce["data"]["init_args"]
    assert ce["trainer"]["max_epochs"] == 500 and d["batch_size"] == 1024 and m["lr"] == 0.8
    assert (m["momentum"], m["weight_decay"], m["scheduler"], m["lr_interval"]) == (0.9, 1e-4, "cosine", "epoch")
    assert (m["warmup_epochs"], m["warmup_from"], m["min_lr_ratio"]) == (10, 0.01, 0.001)
    assert (m["backbone"], m["cifar_stem"], m["backbone_init"]) == ("resnet50", True, "kaiming")
    assert d["augment"] == "rrc_flip" and d["rrc_scale"] == [0.2, 1.0] and d["val_fraction"] == 0.0
    assert d["mean"] == SEED_CIFAR10_MEAN and d["std"] == SEED_CIFAR10_STD
    lin = _config("linear_probe/cifar10.yaml")  # main_linear.py + README: batch 512, lr 5 (SupCon)
    m, d = lin["model"]["init_args"], lin["data"]["init_args"]
    assert lin["trainer"]["max_epochs"] == 100 and d["batch_size"] == 512 and m["lr"] == 5.0
    assert (m["momentum"], m["weight_decay"], m["scheduler"], m["lr_interval"]) == (0.9, 0.0, "step", "epoch")
    assert (m["lr_milestones"], m["lr_gamma"], m["warmup_epochs"]) == ([60, 75, 90], 0.2, 0)
    assert d["augment"] == "rrc_flip" and d["rrc_scale"] == [0.2, 1.0] and d["drop_last"] is False
    assert d["val_fraction"] == 0.0 and d["mean"] == SEED_CIFAR10_MEAN and d["std"] == SEED_CIFAR10_STD


def _our_learning_rates(model: L.LightningModule, epochs: int, n_batches: int) -> list[float]:
    """Every step's learning rate from the module's own ``configure_optimizers`` (a stand-in trainer of the config's size)."""
    model._trainer = SimpleNamespace(  # what configure_optimizers reads from the trainer
        estimated_stepping_batches=epochs * n_batches,
        num_training_batches=n_batches,
        accumulate_grad_batches=1,
        max_epochs=epochs,
    )
    conf = model.configure_optimizers()
    model._trainer = None
    opt, sched = conf["optimizer"], conf["lr_scheduler"]["scheduler"]
    assert conf["lr_scheduler"]["interval"] == "step"
    out = []
    for _ in range(epochs * n_batches):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


def _model_from(rel: str, encoder: Path | None = None) -> L.LightningModule:
    init = linked_model_args(_config(rel))  # num_classes: the data module's, as the command line links it
    cls = {"supcon": SupConModule, "simclr": SupConModule, "ce": CEModule, "linear_probe": LinearProbeModule}[rel.split("/")[0]]
    init.update(backbone=TINY_BACKBONE, cifar_stem=False)  # the schedule does not depend on the network
    if cls is LinearProbeModule:
        init.update(encoder_ckpt=str(encoder))
    return cls(**init)


def _our_batches_per_epoch(cfg: dict[str, Any], n_train: int = 50_000) -> int:
    """Training batches per epoch of a CIFAR-10 config's data module (``drop_last`` defaults to true)."""
    d = cfg["data"]["init_args"]
    n = round(n_train * (1 - d.get("val_fraction", 0.1)))
    return n // d["batch_size"] if d.get("drop_last", True) else math.ceil(n / d["batch_size"])


@pytest.mark.parametrize(
    "rel,epochs,seed_batch,cosine,warm,decay,rate",
    [
        ("supcon/cifar10.yaml", 1000, 1024, True, True, [700, 800, 900], 0.1),  # main_supcon.py, --warm by batch size
        ("simclr/cifar10.yaml", 1000, 1024, True, True, [700, 800, 900], 0.1),
        ("ce/cifar10.yaml", 500, 1024, True, True, [350, 400, 450], 0.1),  # main_ce.py
        ("linear_probe/cifar10.yaml", 100, 512, False, False, [60, 75, 90], 0.2),  # main_linear.py: no --warm, steps
    ],
)
def test_paper_config_schedules_are_the_seeds(
    tmp_path: Path, rel: str, epochs: int, seed_batch: int, cosine: bool, warm: bool, decay: list[int], rate: float
) -> None:
    """Step by step over the whole run: the seed's DataLoader keeps the last partial batch (50,000 images:
    49 batches of 1024, 98 of 512 per epoch)."""
    cfg = _config(rel)
    assert cfg["trainer"]["max_epochs"] == epochs
    encoder = tmp_path / "encoder.pt"
    torch.save(create_backbone(TINY_BACKBONE)[0].state_dict(), encoder)
    model = _model_from(rel, encoder)
    ref = supcontrast_lrs(cfg["model"]["init_args"]["lr"], epochs, math.ceil(50_000 / seed_batch), cosine, warm, decay, rate)
    ours = _our_learning_rates(model, epochs, _our_batches_per_epoch(cfg))
    assert len(ours) == len(ref)
    assert ours == pytest.approx(ref, rel=1e-9, abs=1e-12)


# =============================================================================================
# 3. initialisation in the paper configs
# =============================================================================================
@pytest.mark.parametrize("rel", ["supcon/cifar10.yaml", "simclr/cifar10.yaml", "ce/cifar10.yaml"])
def test_paper_configs_build_the_seeds_resnet_init(rel: str) -> None:
    """resnet_big.py: no zero-initialised last BatchNorm in the blocks (timm's default has them)."""
    init = linked_model_args(_config(rel))
    init.update(backbone="resnet18")  # same init code path as resnet50, a quarter of the size
    model = {"ce": CEModule}.get(rel.split("/")[0], SupConModule)(**init)
    bns = [m for m in model.backbone.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert bns and all(bool(torch.all(bn.weight == 1)) and bool(torch.all(bn.bias == 0)) for bn in bns)
    conv = model.backbone.layer3[0].conv1.weight  # kaiming-normal, fan_out: std sqrt(2 / (out * k * k))
    assert float(conv.detach().std()) == pytest.approx(math.sqrt(2.0 / (conv.shape[0] * conv[0, 0].numel())), rel=0.1)


# =============================================================================================
# 4a. the linear stage's crop scale
# =============================================================================================
def _crop(transform: Any) -> v2.RandomResizedCrop:
    crops = [t for t in getattr(transform, "transforms", []) if isinstance(t, v2.RandomResizedCrop)]
    assert len(crops) == 1, transform
    return crops[0]


def test_rrc_scale_reaches_the_train_transform(tmp_path: Path) -> None:
    dm = OrdinalShapesDataModule(
        num_classes=4, train_size=16, val_size=8, test_size=8, batch_size=4, num_workers=0, augment="rrc_flip", rrc_scale=(0.2, 1.0)
    )
    dm.setup("fit")
    assert tuple(_crop(dm.train_set.transform).scale) == (0.2, 1.0)
    x, _ = dm.train_set[0]
    assert x.shape == (3, 32, 32)
    # the default, and the data modules that forward their arguments to the base
    default = OrdinalShapesDataModule(num_classes=4, augment="rrc_flip")
    assert tuple(_crop(default.train_image_transform()).scale) == (0.5, 1.0)
    cifar = CIFAR10DataModule(root=str(tmp_path), download=False, augment="rrc_flip", rrc_scale=[0.3, 0.9])
    assert tuple(_crop(cifar.train_image_transform()).scale) == (0.3, 0.9)
    folder = ImageFolderDataModule(root=str(tmp_path), augment="rrc_flip", rrc_scale=[0.25, 1])
    assert tuple(_crop(folder.train_image_transform()).scale) == (0.25, 1.0)


@pytest.mark.parametrize("rel", ["linear_probe/cifar10.yaml", "linear_probe/cifar10_cpu.yaml", "ce/cifar10.yaml", "ce/cifar10_cpu.yaml"])
def test_configs_build_the_seeds_crop(tmp_path: Path, rel: str) -> None:
    """main_ce.py's set_loader (also main_linear.py's): RandomResizedCrop(32, scale=(0.2, 1.)) then a flip."""
    data = _config(rel)["data"]
    cls = {"CIFAR10DataModule": CIFAR10DataModule, "ImageFolderDataModule": ImageFolderDataModule}[data["class_path"].split(".")[-1]]
    init = dict(data["init_args"], root=str(tmp_path))
    transform = cls(**init).train_image_transform()
    crop = _crop(transform)
    assert tuple(crop.scale) == (0.2, 1.0) and list(crop.size) == [32, 32]
    names = [type(t).__name__ for t in transform.transforms]
    assert names.index("RandomResizedCrop") + 1 == names.index("RandomHorizontalFlip")


@pytest.mark.parametrize(
    "value",
    [(0.5,), (0.2, 0.5, 1.0), "0.2,1", (0.0, 1.0), (-0.1, 1.0), (0.8, 0.2), (0.2, 1.5), (math.nan, 1.0), (True, 1.0), None],
    ids=["one", "three", "string", "zero", "negative", "reversed", "above-one", "nan", "bool", "none"],
)
def test_bad_rrc_scale_is_a_clear_error(value: Any) -> None:
    with pytest.raises(DataConfigError, match=r"rrc_scale.*0 < min <= max <= 1, e\.g\. rrc_scale: \[0\.2, 1\.0\]"):
        OrdinalShapesDataModule(num_classes=4, augment="rrc_flip", rrc_scale=value)


def test_rrc_scale_that_cannot_apply_warns() -> None:
    with pytest.warns(UserWarning, match=r"rrc_scale=\[0\.2, 1\.0\] has no effect.*set augment: rrc_flip"):
        OrdinalShapesDataModule(num_classes=4, augment="flip", rrc_scale=(0.2, 1.0))
    from cloc_lightning.data import SupConViews

    with pytest.warns(UserWarning, match=r"train_views is set and the views use their own crop scale \(e\.g\. SupConViews\.scale\)"):
        OrdinalShapesDataModule(num_classes=4, augment="rrc_flip", rrc_scale=(0.2, 1.0), train_views=SupConViews(2))


# =============================================================================================
# 4b. the linear stage reports the final and the best validation accuracy
# =============================================================================================
#: validation labels: class c appears COUNTS[c] times (20 images)
COUNTS = [10, 6, 3, 1]
#: the class the classifier is forced to predict in validation epoch e: accuracy COUNTS[c] / 20
#: goes 0.3, 0.5, 0.15, 0.05, 0.5 (a tie: the first stays the best), 0.3 -- it does not always improve
FORCED = [1, 0, 2, 3, 0, 1]


class ForceClass(L.Callback):
    """Before each validation epoch, make the linear head predict ``FORCED[epoch]`` for every image."""

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: LinearProbeModule) -> None:
        with torch.no_grad():
            pl_module.head.weight.zero_()
            pl_module.head.bias.zero_()
            pl_module.head.bias[FORCED[trainer.current_epoch]] = 10.0


class Recorder(L.Callback):
    """What the module logged after each (non-sanity) validation epoch."""

    def __init__(self) -> None:
        self.rows: list[dict[str, float]] = []

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            self.rows.append({k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")})


def _expected(task: str) -> dict[str, dict[str, list[float]]]:
    """Per epoch: the metric, its running best and the epoch of that best, computed from COUNTS and FORCED."""
    labels = np.repeat(np.arange(len(COUNTS)), COUNTS)
    series = {"val/acc": ([float(np.mean(labels == c)) for c in FORCED], max)}
    if task == "ordinal":
        series["val/mae"] = ([float(np.mean(np.abs(labels - c))) for c in FORCED], min)
    out = {}
    for name, (values, pick) in series.items():
        best, best_epoch = [], []
        for e in range(len(values)):
            b = pick(values[: e + 1])
            best.append(b)
            best_epoch.append(float(values.index(b)))  # the first epoch that reached it
        out[name] = {"value": values, "best": best, "best_epoch": best_epoch}
    return out


def _loaders() -> tuple[DataLoader, DataLoader]:
    g = torch.Generator().manual_seed(0)
    train = TensorDataset(torch.randn(16, 3, 32, 32, generator=g), torch.arange(16) % len(COUNTS))
    val_y = torch.from_numpy(np.repeat(np.arange(len(COUNTS)), COUNTS)).long()
    val = TensorDataset(torch.randn(len(val_y), 3, 32, 32, generator=g), val_y)
    # one validation batch: torchmetrics' compute groups (checked on the first update) then cannot merge
    # val/mae with val/acc_pm1 by a coincidence of a first batch of zeros predicted as ones
    return DataLoader(train, batch_size=8), DataLoader(val, batch_size=len(val_y))


@pytest.fixture(scope="module")
def encoder_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("encoder") / "encoder.pt"
    torch.manual_seed(0)
    torch.save(create_backbone(TINY_BACKBONE)[0].state_dict(), path)
    return path


def _probe(encoder: Path, task: str) -> LinearProbeModule:
    return LinearProbeModule(num_classes=len(COUNTS), task=task, encoder_ckpt=str(encoder), backbone=TINY_BACKBONE, lr=0.1)


def _trainer(root: Path, epochs: int, *callbacks: L.Callback, logger: Any = False) -> L.Trainer:
    return cpu_trainer(root, max_epochs=epochs, logger=logger, num_sanity_val_steps=1, callbacks=[ForceClass(), *callbacks])


# the nominal case in the long tier (9 s of the fast tier); the ordinal one stays fast
@pytest.mark.parametrize("task", [pytest.param("nominal", marks=pytest.mark.slow), "ordinal"])
def test_linear_stage_logs_final_and_best_over_a_fit(
    tmp_path: Path, encoder_file: Path, task: str, capsys: pytest.CaptureFixture[str]
) -> None:
    expected = _expected(task)
    rec = Recorder()
    ckpt = ModelCheckpoint(
        dirpath=tmp_path / "ckpt",
        monitor="val/acc" if task == "nominal" else "val/mae",
        mode="max" if task == "nominal" else "min",
        save_last=False,
    )
    logger = CSVLogger(str(tmp_path), name="lin", version=0)
    model = _probe(encoder_file, task)
    train, val = _loaders()
    trainer = _trainer(tmp_path, len(FORCED), rec, ckpt, logger=logger)
    trainer.fit(model, train, val)

    # every epoch: the epoch's own value and the running best (with its epoch)
    assert len(rec.rows) == len(FORCED)
    for name, exp in expected.items():
        assert [r[name] for r in rec.rows] == pytest.approx(exp["value"])
        assert [r[f"{name}_best"] for r in rec.rows] == pytest.approx(exp["best"])
        assert [r[f"{name}_best_epoch"] for r in rec.rows] == exp["best_epoch"]
    # the end of fit: final and best, printed, in the loggers and on the module
    acc = expected["val/acc"]
    final, best, best_epoch = acc["value"][-1], acc["best"][-1], int(acc["best_epoch"][-1])
    assert (final, best, best_epoch) == (0.3, 0.5, 1)
    summary = model.val_summary["val/acc"]
    assert summary == pytest.approx({"final": final, "final_epoch": len(FORCED) - 1, "best": best, "best_epoch": best_epoch})
    out = capsys.readouterr().out
    assert f"linear probe: val/acc final {final:.4f} (epoch {len(FORCED) - 1}), best {best:.4f} (epoch {best_epoch})" in out
    if task == "ordinal":
        mae = expected["val/mae"]
        assert model.val_summary["val/mae"]["best"] == pytest.approx(mae["best"][-1])
        assert f"val/mae final {mae['value'][-1]:.4f}" in out
    with open(tmp_path / "lin" / "version_0" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    logged = {k: float(v) for row in rows for k, v in row.items() if v not in ("", None) and k.startswith("val/acc_")}
    assert logged["val/acc_final"] == pytest.approx(final) and logged["val/acc_best"] == pytest.approx(best)
    # the best checkpoint is the best epoch's, and a test run in the same process reports both numbers
    if task == "nominal":
        assert float(ckpt.best_model_score) == pytest.approx(best) and "epoch=1" in Path(ckpt.best_model_path).name
    result = trainer.test(model, val, ckpt_path=ckpt.best_model_path, verbose=False)[0]
    assert result["val/acc_final"] == pytest.approx(final) and result["val/acc_best"] == pytest.approx(best)


@pytest.mark.slow  # long tier: a real multi-epoch fit (14 s of the fast tier, measured idle at 788d45e+)
def test_linear_stage_best_survives_a_resumed_fit(tmp_path: Path, encoder_file: Path) -> None:
    train, val = _loaders()
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    first = _probe(encoder_file, "nominal")
    _trainer(tmp_path, 3, ckpt).fit(first, train, val)
    assert first.val_summary["val/acc"]["best"] == pytest.approx(0.5)
    resumed = _probe(encoder_file, "nominal")  # a fresh process: the history comes from the checkpoint
    rec = Recorder()
    _trainer(tmp_path, len(FORCED), rec).fit(resumed, train, val, ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"))
    exp = _expected("nominal")["val/acc"]
    assert [r["val/acc_best"] for r in rec.rows] == pytest.approx(exp["best"][3:])
    assert resumed.val_summary["val/acc"] == pytest.approx(
        {"final": exp["value"][-1], "final_epoch": len(FORCED) - 1, "best": 0.5, "best_epoch": 1}
    )
