"""Rank-N-Contrast as a two-stage method: RnCModule (stage one) and LinearRegressorModule (stage two).

The training loss is checked against eq. 2 of Zha et al. (NeurIPS 2023) written here as a plain
loop over anchors, positives and their negative sets, on the features the module produced; the
regressor's metrics against NumPy on a batch (nearest-rank arg-max metrics, the clamped output's
absolute error); stage one -> stage two through checkpoints with the encoder frozen; a user's
subclass; bad inputs; and both shipped demo configs through the CLI (in-process), with ``test``
and ``probe`` on their checkpoints.
"""

from __future__ import annotations

import csv
import json
import math
import warnings
from functools import partial
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from cloc_lightning.checkpoints import ENCODER_META_KEY
from cloc_lightning.cli import main
from cloc_lightning.data import OrdinalShapesDataModule, SupConViews
from cloc_lightning.losses import RnCLoss
from cloc_lightning.methods import LinearProbeModule, LinearRegressorModule, RnCModule
from tests._reliability import SMALL
from tests.conftest import REPO, cpu_trainer

CONFIGS = REPO / "configs" / "rnc"


def _dm(n_views: int | None = 2, num_classes: int = 4, **kw: Any) -> OrdinalShapesDataModule:
    args: dict[str, Any] = dict(
        num_classes=num_classes, train_size=32, val_size=16, test_size=16, batch_size=8, num_workers=0, image_size=16, augment="none"
    )
    args.update(kw)
    return OrdinalShapesDataModule(train_views=SupConViews(n_views, scale=(0.8, 1.0)) if n_views else None, **args)


_trainer = partial(cpu_trainer, max_epochs=1, log_every_n_steps=1, limit_train_batches=2, limit_val_batches=1, num_sanity_val_steps=0)


def _fit(model: L.LightningModule, dm: L.LightningDataModule, trainer: L.Trainer) -> L.Trainer:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model, datamodule=dm)
    return trainer


# ------------------------------------------------------------ eq. 2, a plain loop
def rnc_eq2(z: np.ndarray, y: np.ndarray, tau: float, label_distance: str = "l1", similarity: str = "l2") -> float:
    """Eq. 2 of the paper on ``z`` [bsz, n_views, dim] and targets ``y`` [bsz] or [bsz, L], one term at a time (float64)."""
    bsz, n_views, _ = z.shape
    views = [z[s, v] for v in range(n_views) for s in range(bsz)]
    labels = [np.atleast_1d(y[s]).astype(np.float64) for _ in range(n_views) for s in range(bsz)]
    m = len(views)

    def sim(a: np.ndarray, b: np.ndarray) -> float:
        if similarity == "cosine":
            return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
        return -float(np.linalg.norm(a - b))

    def dist(a: np.ndarray, b: np.ndarray) -> float:
        return float(np.abs(a - b).sum()) if label_distance == "l1" else float(np.linalg.norm(a - b))

    total = 0.0
    for i in range(m):
        per_anchor = 0.0
        for j in range(m):
            if j == i:
                continue
            negatives = [k for k in range(m) if k != i and dist(labels[i], labels[k]) >= dist(labels[i], labels[j])]
            denominator = sum(math.exp(sim(views[i], views[k]) / tau) for k in negatives)
            per_anchor += -math.log(math.exp(sim(views[i], views[j]) / tau) / denominator)
        total += per_anchor / (m - 1)
    return total / m


@pytest.mark.parametrize(
    ("settings", "projector"),
    [
        ({"temperature": 2.0}, None),  # the paper's: L1 labels, L2 features, no projector
        ({"temperature": 0.5, "label_distance": "l2", "feature_similarity": "cosine"}, 8),
    ],
    ids=["paper", "projector-cosine"],
)
def test_training_loss_is_eq2_on_the_features_the_module_produced(settings: dict[str, Any], projector: int | None) -> None:
    torch.manual_seed(0)
    model = RnCModule(**settings, projector_dim=projector, online_probe=False, **SMALL)
    model.eval()  # BatchNorm with running statistics: the recomputation below sees the same network
    views = [torch.randn(5, 3, 16, 16), torch.randn(5, 3, 16, 16)]
    y = torch.tensor([0, 3, 1, 1, 2])  # a tie (1, 1) in label distance on purpose
    loss = model.training_step((views, y), 0)
    with torch.no_grad():
        z = model.projector(model.backbone(torch.cat(views)))
    z3 = torch.stack([z[:5], z[5:]], dim=1).double().numpy()  # [bsz, n_views, dim], views of image s at [s, v]
    expected = rnc_eq2(
        z3, y.numpy(), settings["temperature"], settings.get("label_distance", "l1"), settings.get("feature_similarity", "l2")
    )
    assert float(loss.detach()) == pytest.approx(expected, rel=1e-5)
    # float targets (a vector per image) go to the loss as they come
    targets = torch.tensor([[0.5, 1.0], [2.0, 0.0], [1.5, 1.5], [0.0, 0.0], [3.0, 1.0]])
    vector = model.training_step((views, targets), 0)
    assert float(vector.detach()) == pytest.approx(
        rnc_eq2(
            z3, targets.numpy(), settings["temperature"], settings.get("label_distance", "l1"), settings.get("feature_similarity", "l2")
        ),
        rel=1e-5,
    )


def test_fit_logs_the_loss_and_the_online_probe_and_checkpoints_the_encoder(tmp_path: Path) -> None:
    model = RnCModule(lr=0.05, **SMALL)
    assert isinstance(model.projector, nn.Identity) and isinstance(model.criterion, RnCLoss)
    assert (model.criterion.temperature, model.criterion.label_distance, model.criterion.feature_similarity) == (2.0, "l1", "l2")
    before = [p.detach().clone() for p in model.backbone.parameters()]
    trainer = _fit(model, _dm(), _trainer(tmp_path))
    m = trainer.callback_metrics
    for key in ("train/loss", "train/online_probe/loss", "val/online_probe/acc", "val/online_probe/mae", "val/online_probe/qwk"):
        assert key in m and math.isfinite(float(m[key])), key
    assert any(not torch.equal(a, b) for a, b in zip(before, model.backbone.parameters(), strict=True))
    assert trainer.checkpoint_callback.monitor == "val/online_probe/acc"
    groups = {g["name"]: g for g in trainer.optimizers[0].param_groups}
    assert isinstance(trainer.optimizers[0], torch.optim.SGD) and groups["model"]["momentum"] == 0.9
    assert groups["model"]["weight_decay"] == 1e-4 and groups["model"]["initial_lr"] == 0.05
    path = tmp_path / "final.ckpt"
    trainer.save_checkpoint(path)
    raw = torch.load(path, map_location="cpu", weights_only=False)
    assert raw[ENCODER_META_KEY]["prefix"] == "backbone." and raw[ENCODER_META_KEY]["class_path"].endswith("RnCModule")
    reloaded = RnCModule.load_from_checkpoint(path)
    x = torch.randn(3, 3, 16, 16)
    model.eval(), reloaded.eval()
    out = reloaded(x)
    assert torch.allclose(out["features"], model(x)["features"], atol=1e-6) and torch.equal(out["features"], out["embedding"])


# ------------------------------------------------------------ stage two
def _quadratic_kappa(y: np.ndarray, p: np.ndarray, k: int) -> float:
    observed = np.zeros((k, k))
    for a, b in zip(y, p, strict=True):
        observed[a, b] += 1
    weights = np.array([[(i - j) ** 2 / (k - 1) ** 2 for j in range(k)] for i in range(k)])
    expected = np.outer(observed.sum(1), observed.sum(0)) / observed.sum()
    return float(1.0 - (weights * observed).sum() / (weights * expected).sum())


@pytest.fixture(scope="module")
def stage_one(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An RnCModule checkpoint after two training steps (the encoder of the stage-two tests)."""
    tmp = tmp_path_factory.mktemp("rnc")
    torch.manual_seed(0)
    trainer = _fit(RnCModule(lr=0.05, **SMALL), _dm(), _trainer(tmp, limit_val_batches=0))
    path = tmp / "stage_one.ckpt"
    trainer.save_checkpoint(path)
    return path


def test_regressor_metrics_equal_numpy_on_a_batch(stage_one: Path, tmp_path: Path) -> None:
    k = 4
    model = LinearRegressorModule(num_classes=k, encoder_ckpt=str(stage_one), task="ordinal")
    torch.manual_seed(1)
    x = torch.randn(24, 3, 16, 16)
    y = torch.arange(24) % k
    with torch.no_grad():  # outputs spread over [-1.5, K + 0.5]: both clamps and every rank are hit
        f = model.encode(x)
        w = torch.randn(f.shape[1])
        raw = f @ w
        scale = (k + 2.0) / (raw.max() - raw.min())
        model.head.weight.copy_((w * scale)[None])
        model.head.bias.copy_(-1.5 - raw.min() * scale)
        r = model.regress(x).double().numpy()
    assert r.min() < 0 and r.max() > k - 1
    # the head is the only learnt part: r = f . w + b, computed here from the frozen features
    np.testing.assert_allclose(r, (f.double() @ model.head.weight[0].double() + model.head.bias.double()).detach().numpy(), rtol=1e-5)
    got = _trainer(tmp_path).validate(model, dataloaders=DataLoader(TensorDataset(x, y), batch_size=24), verbose=False)[0]
    labels = y.numpy()
    clamped = np.clip(r, 0, k - 1)
    nearest = np.ceil(clamped - 0.5).astype(int)  # round, ties to the lower rank
    assert not np.any(np.isclose(clamped % 1.0, 0.5))  # no ties in this batch
    assert got["val/mae"] == pytest.approx(np.abs(nearest - labels).mean(), abs=1e-6)
    assert got["val/acc"] == pytest.approx((nearest == labels).mean(), abs=1e-6)
    assert got["val/acc_pm1"] == pytest.approx((np.abs(nearest - labels) <= 1).mean(), abs=1e-6)
    assert got["val/qwk"] == pytest.approx(_quadratic_kappa(labels, nearest, k), abs=1e-5)
    assert got["val/mae_expected"] == pytest.approx(np.abs(clamped - labels).mean(), abs=1e-5)
    assert got["val/loss"] == pytest.approx(np.abs(r - labels).mean(), abs=1e-5)  # the L1 of the raw output
    with torch.no_grad():
        pred = model.predict_step((x, y), 0)
    assert pred["pred"].tolist() == nearest.tolist() and "probs" not in pred
    np.testing.assert_allclose(pred["expected"].numpy(), clamped, atol=1e-5)
    np.testing.assert_allclose(pred["regression"].numpy(), r, atol=1e-5)
    with torch.no_grad():
        assert model(x).argmax(dim=1).tolist() == nearest.tolist()


def test_stage_one_to_stage_two_through_checkpoints_keeps_the_encoder_frozen(stage_one: Path, tmp_path: Path) -> None:
    encoder = {
        k[len("backbone.") :]: v for k, v in torch.load(stage_one, weights_only=False)["state_dict"].items() if k.startswith("backbone.")
    }
    model = LinearRegressorModule(num_classes=4, encoder_ckpt=str(stage_one))
    state = model.backbone.state_dict()
    assert state.keys() == encoder.keys() and all(torch.equal(state[k], v) for k, v in encoder.items())
    head = model.head.weight.detach().clone()
    trainer = _fit(model, _dm(None, augment="flip"), _trainer(tmp_path, enable_checkpointing=True))
    after = model.backbone.state_dict()  # weights and BatchNorm running statistics
    assert all(torch.equal(after[k], v) for k, v in encoder.items())
    assert not torch.equal(model.head.weight.detach(), head)
    assert trainer.checkpoint_callback.monitor == "val/mae_expected" and trainer.checkpoint_callback.mode == "min"
    assert set(model.val_summary) == {"val/mae_expected", "val/mae", "val/acc"}
    groups = trainer.optimizers[0].param_groups
    assert len(groups) == 1 and [p.shape for p in groups[0]["params"]] == [(1, model.feature_dim), (1,)]
    assert groups[0]["initial_lr"] == 0.05 and groups[0]["weight_decay"] == 0.0
    test = trainer.test(model, datamodule=_dm(None), verbose=False)[0]
    assert {"test/mae", "test/mae_expected", "test/acc", "test/qwk", "test/acc_pm1"} <= set(test)
    reloaded = LinearRegressorModule.load_from_checkpoint(trainer.checkpoint_callback.last_model_path)
    x = torch.randn(3, 3, 16, 16)
    model.eval()
    assert torch.allclose(reloaded.regress(x), model.regress(x), atol=1e-6)


class LinearProjectorRnC(RnCModule):
    """A user's subclass: a linear projector of their own width and a cosine RnC loss."""

    def __init__(self, proj_out: int = 12, **kwargs: Any) -> None:
        super().__init__(**kwargs)

    def build_projector(self) -> nn.Module:
        return nn.Linear(self.feature_dim, self.hparams.proj_out)

    def build_loss(self) -> nn.Module:
        return RnCLoss(temperature=self.temperature, feature_similarity="cosine")


def test_user_subclass_with_its_own_projector_and_loss_trains_and_reloads(tmp_path: Path) -> None:
    model = LinearProjectorRnC(proj_out=12, lr=0.05, **SMALL)
    trainer = _fit(model, _dm(), _trainer(tmp_path, enable_checkpointing=True))
    assert math.isfinite(float(trainer.callback_metrics["train/loss"]))
    reloaded = LinearProjectorRnC.load_from_checkpoint(trainer.checkpoint_callback.last_model_path)
    assert reloaded.criterion.feature_similarity == "cosine"
    assert reloaded(torch.randn(2, 3, 16, 16))["embedding"].shape == (2, 12)
    assert reloaded.embed(torch.randn(2, 3, 16, 16)).shape == (2, 12)


# ------------------------------------------------------------ bad inputs
def test_bad_inputs_name_the_fix(stage_one: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"temperature must be > 0.0, got 0.0.*temperature 2.0"):
        RnCModule(temperature=0.0, **SMALL)
    with pytest.raises(ValueError, match="n_views must be >= 2, got 1.*set n_views: 2"):
        RnCModule(n_views=1, **SMALL)
    with pytest.raises(ValueError, match="label_distance must be 'l1' or 'l2'"):
        RnCModule(label_distance="huber", **SMALL)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"RnCModule needs multi-view batches; set data.train_views"):
        _fit(RnCModule(**SMALL), _dm(None), _trainer(tmp_path))
    with pytest.raises(ValueError, match=r"n_views=2\) got 3 view\(s\).*n_views: 2 \(or model.n_views: 3\)"):
        _fit(RnCModule(**SMALL), _dm(3), _trainer(tmp_path))
    model = RnCModule(num_classes=4, task="ordinal", **SMALL)
    one_view = (torch.randn(4, 3, 16, 16), torch.tensor([0, 1, 2, 3]))
    with pytest.raises(ValueError, match="needs multi-view batches; set data.train_views"):
        model.training_step(one_view, 0)
    views = [torch.randn(4, 3, 16, 16)] * 2
    with pytest.raises(ValueError, match=r"no label \(class < 0\).*train on labelled images only"):
        model.training_step((views, torch.tensor([0, -1, 2, 3])), 0)
    with pytest.raises(ValueError, match="targets are floats.*online_probe: false and model.knn_k: 0"):
        model.training_step((views, torch.tensor([0.5, 1.0, 2.0, 3.0])), 0)
    with pytest.raises(ValueError, match="task is 'nominal'; for unordered classes use .*LinearProbeModule"):
        LinearRegressorModule(num_classes=4, encoder_ckpt=str(stage_one), task="nominal")
    with pytest.raises(ValueError, match="task is 'nominal'"):  # task auto, nominal data
        nominal = _dm(None)
        nominal.task = "nominal"  # type: ignore[misc]
        _fit(LinearRegressorModule(num_classes=4, encoder_ckpt=str(stage_one)), nominal, _trainer(tmp_path))
    # a linear classifier's checkpoint given to the regressor
    probe = LinearProbeModule(num_classes=4, encoder_ckpt=str(stage_one))
    trainer = _trainer(tmp_path)
    trainer.strategy.connect(probe)
    trainer.save_checkpoint(tmp_path / "probe.ckpt")
    with pytest.raises(ValueError, match="holds a linear classifier with 4 outputs.*LinearProbeModule"):
        LinearRegressorModule.load_from_checkpoint(tmp_path / "probe.ckpt")


# ------------------------------------------------------------ the shipped configs through the CLI
TINY = [
    "--data.image_size", "16", "--data.train_size", "32", "--data.val_size", "16", "--data.test_size", "16",
    "--data.batch_size", "8", "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2",
    "--trainer.limit_val_batches", "1", "--trainer.limit_test_batches", "1", "--trainer.enable_progress_bar", "false",
    "--trainer.enable_model_summary", "false", "--trainer.logger.init_args.save_dir", "runs",
]  # fmt: skip


def test_demo_configs_both_stages_then_test_and_probe_through_the_cli(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.argv", ["cloc-lightning"])
    small = ["--model.backbone_kwargs", json.dumps(SMALL["backbone_kwargs"])]  # stage two reads it from the checkpoint
    main(["fit", "--config", str(CONFIGS / "demo.yaml"), *small, *TINY, "--test_after_fit", "false"])
    one = tmp_path / "runs" / "rnc_demo" / "version_0" / "checkpoints"
    assert (one / "last.ckpt").is_file() and list(one.glob("best-*.ckpt"))
    stage_two = ["--config", str(CONFIGS / "demo_linear.yaml"), "--model.encoder_ckpt", str(one / "last.ckpt"), *TINY]
    main(["fit", *stage_two])
    two = tmp_path / "runs" / "rnc_demo_linear" / "version_0" / "checkpoints"
    out = capsys.readouterr().out
    assert "linear regressor: val/mae_expected final" in out, out[-2000:]
    assert "test/mae_expected" in out  # test_after_fit on the best checkpoint
    best = sorted(two.glob("best-*.ckpt"))
    assert best and (two / "last.ckpt").is_file()
    main(["test", *stage_two, "--ckpt_path", str(best[-1])])
    assert "test/mae_expected" in capsys.readouterr().out
    main(["predict", *stage_two, "--ckpt_path", str(best[-1])])  # the test split -> predictions.csv
    (written,) = (tmp_path / "runs" / "rnc_demo_linear").rglob("predictions.csv")
    rows = list(csv.DictReader(written.open()))
    assert len(rows) == 16 and "p0" not in rows[0]
    for row in rows:  # pred = the nearest rank of the clamped output
        r = float(row["regression"])
        assert float(row["expected"]) == pytest.approx(min(max(r, 0.0), 5.0), abs=1e-4)
        assert int(row["pred"]) == math.ceil(float(row["expected"]) - 0.5)
    main(
        [
            "probe",
            "--ckpt",
            str(one / "last.ckpt"),
            "--data",
            "OrdinalShapesDataModule",
            "--data.num_classes",
            "6",
            "--data.train_size",
            "24",
            "--data.test_size",
            "12",
            "--data.image_size",
            "16",
            "--data.num_workers",
            "0",
            "--data.batch_size",
            "16",
            "--output",
            str(tmp_path / "probe.json"),
        ]
    )
    result = json.loads((tmp_path / "probe.json").read_text())
    assert 0.0 <= result["top1"] <= 1.0 and result["encoder"].endswith("RnCModule)")


def test_eval_outputs_default_is_the_cross_entropy_of_the_class_scores() -> None:
    """The hook the regressor overrides keeps every classifier's validation numbers as they were."""
    from cloc_lightning.methods import CEModule

    model = CEModule(num_classes=4, task="ordinal", **SMALL).eval()
    x, y = torch.randn(6, 3, 16, 16), torch.tensor([0, 1, 2, 3, 0, 1])
    loss, scores, extra = model.eval_outputs(x, y)
    logits = model(x)
    assert torch.equal(scores, logits.float()) and extra == {}
    assert torch.equal(loss, F.cross_entropy(logits.float(), y))
