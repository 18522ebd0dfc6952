"""Stage two: LinearProbeModule on a frozen stage-one encoder (CLI and Python), the encoder hook, the offline probe."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from torch.utils.data import DataLoader, TensorDataset

from cloc_lightning.checkpoints import ENCODER_META_KEY, encoder_state_dict, load_encoder
from cloc_lightning.cli import main
from cloc_lightning.methods import CEModule, LinearProbeModule, OrdinalCLIPModule, SupConModule
from cloc_lightning.nn.backbones import create_backbone
from cloc_lightning.probe import extract_features, logistic_regression_probe, probe_checkpoint
from tests._reliability import FIXTURE_CKPT, TINY_CLIP, _trainer
from tests.conftest import TINY_BACKBONE, cpu_trainer, run_cli, tiny_shapes

STAGE_ONE_YAML = """
seed_everything: 0
trainer:
  max_epochs: 1
  limit_train_batches: 3
  limit_val_batches: 1
  enable_progress_bar: false
  enable_model_summary: false
  logger:
    class_path: lightning.pytorch.loggers.TensorBoardLogger
    init_args: {{save_dir: runs, name: stage1}}
model:
  class_path: cloc_lightning.methods.SupConModule
  init_args: {{method: supcon, backbone: {backbone}, lr: 0.05}}
data:
  class_path: cloc_lightning.data.OrdinalShapesDataModule
  init_args:
    num_classes: 6
    train_size: 96
    val_size: 24
    test_size: 24
    batch_size: 16
    num_workers: 0
    train_views:
      class_path: cloc_lightning.data.SupConViews
      init_args: {{n_views: 2}}
"""

SHAPES = [
    "--data",
    "OrdinalShapesDataModule",
    "--data.num_classes",
    "6",
    "--data.train_size",
    "96",
    "--data.val_size",
    "24",
    "--data.test_size",
    "24",
    "--data.batch_size",
    "16",
    "--data.num_workers",
    "0",
]


def _backbone_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k[len("backbone.") :]: v for k, v in state.items() if k.startswith("backbone.")}


@pytest.mark.slow  # a CLI subprocess run: the long tier (pytest -m slow)
def test_two_stage_path_through_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "stage1.yaml"
    cfg.write_text(STAGE_ONE_YAML.format(backbone=TINY_BACKBONE))
    run_cli(["fit", "--config", str(cfg)], tmp_path)
    stage1 = tmp_path / "runs" / "stage1" / "version_0" / "checkpoints" / "last.ckpt"
    assert stage1.is_file()
    out = run_cli(
        [
            "fit",
            "--model",
            "LinearProbeModule",
            "--model.num_classes",
            "6",
            "--model.task",
            "nominal",
            "--model.encoder_ckpt",
            str(stage1),
            "--model.lr",
            "0.5",
            *SHAPES,
            "--data.augment",
            "flip",
            "--trainer.max_epochs",
            "2",
            "--trainer.enable_progress_bar",
            "false",
            "--trainer.enable_model_summary",
            "false",
            "--trainer.logger.init_args.save_dir",
            "runs",
            "--trainer.logger.init_args.name",
            "stage2",
            "--test_after_fit",
            "true",
        ],
        tmp_path,
    ).stdout
    assert "test/acc" in out and "test/acc_top5" in out  # top-1 / top-5 of the linear classifier
    best = sorted((tmp_path / "runs" / "stage2" / "version_0" / "checkpoints").glob("best-*.ckpt"))
    assert best
    s1 = torch.load(stage1, map_location="cpu", weights_only=False)["state_dict"]
    s2 = torch.load(best[0], map_location="cpu", weights_only=False)
    # frozen encoder: weights AND BatchNorm running statistics exactly as in stage one
    enc1, enc2 = _backbone_state(s1), _backbone_state(s2["state_dict"])
    assert set(enc1) == set(enc2) and any("running_mean" in k for k in enc1)
    assert all(torch.equal(enc1[k], enc2[k]) for k in enc1)
    assert s2["hyper_parameters"]["encoder_info"]["backbone"] == TINY_BACKBONE
    # the stage-two checkpoint reloads without the stage-one file
    stage1.rename(tmp_path / "moved.ckpt")
    reloaded = LinearProbeModule.load_from_checkpoint(best[0])
    assert reloaded.head.out_features == 6
    # the offline probe command on the stage-one encoder (the entry point in-process: saves a slow start-up)
    main(["probe", "--ckpt", str(tmp_path / "moved.ckpt"), *SHAPES, "--output", str(tmp_path / "probe.json"), "--max_iter", "200"])
    probe = capsys.readouterr().out
    assert "top1:" in probe and "top5:" in probe
    result = json.loads((tmp_path / "probe.json").read_text())
    assert 0.0 <= result["top1"] <= result["top5"] <= 1.0 and result["n_train"] == 96 and result["n_test"] == 24


_shapes = tiny_shapes  # 4 classes, 64/32/32 images, batches of 16


@pytest.fixture(scope="module")
def ce_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A stage-one checkpoint of the CE baseline (trained a few steps, so BN statistics are not the defaults)."""
    root = tmp_path_factory.mktemp("ce")
    model = CEModule(num_classes=4, backbone=TINY_BACKBONE, lr=1e-2)
    trainer = cpu_trainer(root, max_epochs=1, limit_train_batches=2, limit_val_batches=1)
    trainer.fit(model, datamodule=_shapes())
    return Path(trainer.checkpoint_callback.last_model_path)


def test_encoder_frozen_in_eval_mode_with_ordinal_metrics(tmp_path: Path, ce_ckpt: Path) -> None:
    model = LinearProbeModule(num_classes=4, encoder_ckpt=str(ce_ckpt), lr=0.5)
    stage1 = _backbone_state(torch.load(ce_ckpt, map_location="cpu", weights_only=False)["state_dict"])
    assert all(torch.equal(v, model.backbone.state_dict()[k]) for k, v in stage1.items())
    model.train()
    assert model.training and not model.backbone.training and model.head.training
    assert [n for n, p in model.named_parameters() if p.requires_grad] == ["head.weight", "head.bias"]
    head_before = model.head.weight.detach().clone()
    trainer = cpu_trainer(tmp_path, max_epochs=1, limit_train_batches=3)
    trainer.fit(model, datamodule=_shapes())
    after = model.backbone.state_dict()
    assert all(torch.equal(v, after[k]) for k, v in stage1.items())  # incl. BN running_mean/var, num_batches_tracked
    assert not torch.equal(head_before, model.head.weight)
    m = trainer.callback_metrics
    for key in ("train/loss", "val/acc", "val/mae", "val/qwk", "val/acc_pm1"):  # ordinal data: ordinal metrics
        assert key in m and math.isfinite(float(m[key])), key
    assert trainer.checkpoint_callback.monitor == "val/mae"


def test_encoder_errors_name_the_fix(tmp_path: Path, ce_ckpt: Path) -> None:
    with pytest.raises(ValueError, match="needs encoder_ckpt"):
        LinearProbeModule(num_classes=4)
    with pytest.raises(FileNotFoundError, match="does not exist; give the .ckpt of a stage-one run"):
        LinearProbeModule(num_classes=4, encoder_ckpt=str(tmp_path / "missing.ckpt"))
    garbage = tmp_path / "garbage.ckpt"
    garbage.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="cannot read"):
        LinearProbeModule(num_classes=4, encoder_ckpt=str(garbage))
    # a checkpoint of a module whose image encoder is not under 'backbone.' (e.g. a CLIP model)
    clip_like = tmp_path / "clip.ckpt"
    torch.save({"state_dict": {"clip.visual.conv1.weight": torch.zeros(2)}, "hyper_parameters": {"backbone": "x"}}, clip_like)
    with pytest.raises(ValueError, match=r"holds no encoder weights.*\['clip.'\]"):
        LinearProbeModule(num_classes=4, encoder_ckpt=str(clip_like))
    with pytest.raises(ValueError, match="backbone mismatch.*'resnet18'"):
        LinearProbeModule(num_classes=4, encoder_ckpt=str(ce_ckpt), backbone="resnet18")
    with pytest.raises(ValueError, match=r"backbone mismatch.*'test_vit'.*missing \['cls_token'"):
        LinearProbeModule(num_classes=4, encoder_ckpt=str(ce_ckpt), backbone="test_vit")  # other parameter names
    with pytest.raises(ValueError, match="takes its encoder weights from encoder_ckpt"):
        LinearProbeModule(num_classes=4, encoder_ckpt=str(ce_ckpt), pretrained=True)


class FakeEMAModule(SupConModule):
    """Stands for ReLIC: its evaluation encoder is the EMA target's (another state_dict prefix)."""

    encoder_prefix = "target_backbone."


class FakeHookModule(SupConModule):
    """A module that picks its encoder weights with the classmethod hook."""

    @classmethod
    def encoder_state_dict(cls, checkpoint):
        state = checkpoint["state_dict"]
        return {k[len("backbone.") :]: v * 0 + 7 for k, v in state.items() if k.startswith("backbone.")}


def test_encoder_hook_prefix_and_classmethod(tmp_path: Path) -> None:
    enc, _ = create_backbone(TINY_BACKBONE)
    online = {f"backbone.{k}": torch.zeros_like(v) for k, v in enc.state_dict().items()}
    target = {f"target_backbone.{k}": v for k, v in enc.state_dict().items()}
    meta = {"class_path": f"{__name__}.FakeEMAModule", "prefix": "target_backbone.", "backbone": TINY_BACKBONE}
    ckpt = {"state_dict": {**online, **target}, ENCODER_META_KEY: meta}
    found = encoder_state_dict(ckpt)
    assert all(torch.equal(found.state_dict[k], v) for k, v in enc.state_dict().items())
    # the class attribute alone is enough (class known from LightningCLI's _class_path hyper-parameter)
    ckpt2 = {
        "state_dict": {**online, **target},
        "hyper_parameters": {"_class_path": f"{__name__}.FakeEMAModule", "backbone": TINY_BACKBONE},
    }
    assert all(torch.equal(encoder_state_dict(ckpt2).state_dict[k], v) for k, v in enc.state_dict().items())
    ckpt3 = {"state_dict": online, ENCODER_META_KEY: {"class_path": f"{__name__}.FakeHookModule", "backbone": TINY_BACKBONE}}
    assert all(bool((v == 7).all()) for k, v in encoder_state_dict(ckpt3).state_dict.items() if v.is_floating_point())
    # a plain state_dict of the encoder, architecture given explicitly
    path = tmp_path / "encoder.pt"
    torch.save(enc.state_dict(), path)
    with pytest.raises(ValueError, match="does not record its backbone architecture"):
        load_encoder(str(path))
    model = LinearProbeModule(num_classes=3, encoder_ckpt=str(path), backbone=TINY_BACKBONE, normalize_features=True)
    assert torch.allclose(model.encode(torch.randn(2, 3, 32, 32)).norm(dim=1), torch.ones(2), atol=1e-5)


# ----------------------------------------------------------- offline probe
def _blobs(n_per: int, c: int, d: int, spread: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(c, d)) * 5
    y = np.repeat(np.arange(c), n_per)
    return centres[y] + rng.normal(scale=spread, size=(len(y), d)), y


def test_logistic_regression_probe_on_hand_made_problems() -> None:
    # separable blobs: perfect
    X, y = _blobs(30, 3, 4, 0.3, 0)
    Xt, yt = _blobs(10, 3, 4, 0.3, 0)
    res = logistic_regression_probe(X, y, Xt, yt)
    assert res["top1"] == 1.0 and res["train_top1"] == 1.0 and "top5" not in res
    # a hand-made rule on one coordinate, hidden among noise coordinates of a much larger scale
    rng = np.random.default_rng(1)
    X = np.concatenate([rng.uniform(-1, 1, size=(400, 1)), rng.normal(scale=100, size=(400, 5))], axis=1)
    y = (X[:, 0] > 0).astype(int)
    res = logistic_regression_probe(X[:300], y[:300], X[300:], y[300:], C=10.0)
    assert res["top1"] >= 0.95
    # labels unrelated to the features: chance level (10 classes), top-5 about one half
    X = rng.normal(size=(600, 8))
    y = rng.integers(0, 10, size=600)
    res = logistic_regression_probe(X[:400], y[:400], X[400:], y[400:], C=0.01)
    assert 0.0 <= res["top1"] <= 0.25 and 0.3 <= res["top5"] <= 0.7 and res["top5"] >= res["top1"]
    with pytest.raises(ValueError, match="NaN or inf"):
        logistic_regression_probe(np.full((4, 2), np.nan), np.array([0, 1, 0, 1]), np.zeros((2, 2)), np.array([0, 1]))
    with pytest.raises(ValueError, match="fewer than 2 classes"):
        logistic_regression_probe(np.zeros((4, 2)), np.zeros(4), np.zeros((2, 2)), np.zeros(2))


def test_extract_features_drops_unlabelled_and_restores_mode() -> None:
    enc = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 3), torch.nn.BatchNorm1d(3))
    enc.train()
    x, y = torch.randn(10, 3, 2, 2), torch.tensor([0, 1, -1, 2, 0, -1, 1, 2, 0, 1])
    X, Y = extract_features(enc, DataLoader(TensorDataset(x, y), batch_size=4), normalize=True)
    assert enc.training and X.shape == (8, 3) and Y.tolist() == [0, 1, 2, 0, 1, 2, 0, 1]
    enc.eval()
    with torch.no_grad():
        ref = torch.nn.functional.normalize(enc(x), dim=1)[y >= 0].numpy()
    assert np.allclose(X, ref, atol=1e-6)


def test_probe_checkpoint_uses_the_checkpoints_backbone(ce_ckpt: Path) -> None:
    dm = _shapes(noise=4.0)
    res = probe_checkpoint(str(ce_ckpt), dm, max_iter=300)
    assert res["n_train"] == 64 and res["n_test"] == 32 and res["n_features"] == CEModule.load_from_checkpoint(ce_ckpt).feature_dim
    assert "backbone." in res["encoder"] and res["backbone"] == TINY_BACKBONE
    # the same numbers from the module's own backbone, loaded through Lightning instead of the probe's loader
    encoder = CEModule.load_from_checkpoint(ce_ckpt).backbone
    X, y = extract_features(encoder, dm.train_eval_dataloader())
    Xt, yt = extract_features(encoder, dm.test_dataloader())
    ref = logistic_regression_probe(X, y, Xt, yt, max_iter=300)
    assert res["top1"] == pytest.approx(ref["top1"]) and res["train_top1"] == pytest.approx(ref["train_top1"])


# ----------------------------------------------------------- encoder checkpoints of the wrong kind
def test_encoder_ckpt_missing_or_from_the_wrong_module(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="needs encoder_ckpt"):
        LinearProbeModule(num_classes=4)
    with pytest.raises(FileNotFoundError, match="does not exist; give the .ckpt of a stage-one run"):
        LinearProbeModule(num_classes=4, encoder_ckpt=str(tmp_path / "missing.ckpt"))
    margins = tmp_path / "cloc_margins.yaml"  # a file of the wrong kind
    margins.write_text(yaml.safe_dump({"learnable_map": [["fixed", 0.5]] * 3}))
    with pytest.raises(ValueError, match="cannot read .* as a PyTorch checkpoint"):
        LinearProbeModule(num_classes=4, encoder_ckpt=str(margins))
    # an OrdinalCLIP checkpoint: its image encoder is a CLIP visual tower, not a timm backbone
    clip = OrdinalCLIPModule(num_classes=4, clip_model="ViT-S-32-alt", clip_config=TINY_CLIP, num_context_tokens=4)
    trainer = _trainer(tmp_path)
    trainer.strategy.connect(clip)
    trainer.save_checkpoint(str(tmp_path / "oc.ckpt"))
    with pytest.raises(ValueError, match="CLIP visual tower, not a timm backbone.*image_encoder: timm"):
        LinearProbeModule(num_classes=4, encoder_ckpt=str(tmp_path / "oc.ckpt"))
    torch.save({"optimizer_states": [], "epoch": 3}, tmp_path / "no_weights.ckpt")
    with pytest.raises(ValueError, match="neither a Lightning checkpoint nor a state_dict"):
        LinearProbeModule(num_classes=4, encoder_ckpt=str(tmp_path / "no_weights.ckpt"))
    # the right kind (a CLOC checkpoint) works, and a wrong architecture override is named
    assert LinearProbeModule(num_classes=4, encoder_ckpt=str(FIXTURE_CKPT)).feature_dim == 16
    with pytest.raises(ValueError, match="backbone mismatch"):
        LinearProbeModule(num_classes=4, encoder_ckpt=str(FIXTURE_CKPT), backbone="resnet18")


def test_probe_checkpoint_on_the_device_data_path_equals_the_loader_path(ce_ckpt: Path) -> None:
    """``data.augment_on: device`` hands the loop uint8 batches; the offline probe reads loader-finished ones."""
    loader = probe_checkpoint(str(ce_ckpt), _shapes(noise=4.0), max_iter=300)
    device = probe_checkpoint(str(ce_ckpt), _shapes(noise=4.0, cache="memory", augment_on="device"), max_iter=300)
    assert device["n_test"] == loader["n_test"] and device["top1"] == pytest.approx(loader["top1"])


def test_init_from_a_probe_checkpoint_covers_what_evaluation_reads(tmp_path: Path, ce_ckpt: Path) -> None:
    """The encoder comes from ``encoder_ckpt`` (``init_from`` never loads it): a probe's ``init_from`` that holds the
    head is complete for ``test``/``predict``; one without the head's bias leaves exactly that untrained."""
    probe = LinearProbeModule(num_classes=4, encoder_ckpt=str(ce_ckpt), lr=0.5)
    torch.save(probe.state_dict(), tmp_path / "probe.pt")
    torch.save({"head.weight": probe.head.weight}, tmp_path / "head_weight_only.pt")
    keys = probe.evaluation_keys()
    assert set(keys) == {k for k in probe.state_dict() if not k.startswith("backbone.")}
    assert set(keys) <= set(probe.init_from_report(str(tmp_path / "probe.pt"))["loaded"])
    assert set(keys) - set(probe.init_from_report(str(tmp_path / "head_weight_only.pt"))["loaded"]) == {"head.bias"}
