"""ReLIC-sigmoid against the seed (F. Basara, github.com/filipbasara0/sigmoid-contrastive-learning).

Each test compares our code with a small, independent re-implementation of what the
seed's code does, written here (plain loops / NumPy / a few torch ops):

1. encoder BatchNorm mode (``encoder_bn``): ``'frozen_stats'`` keeps the encoders'
   running statistics fixed over real training steps (the state the seed's ``ReLIC``
   constructor leaves its encoder in), ``'train'`` (default; the seed's ``train.py``,
   whose ``torchinfo.summary`` call switches the whole model back to training) moves them;
2. penalty filtering: from ``global_step > filtering_warmup_steps`` the kept pairs'
   ``-logsigmoid`` without the penalty weight (value and gradients, boundary included);
3. normalisation: ImageNet mean/std in the seed-reproduction configs;
4. the multi-crop pipeline's parameters (``scl/aug.py``) at 32, 64 and 96 px;
5. the EMA schedule of ``train.py`` (``beta_schedule='scl_train'``): horizon and lag;
6. the linear probe of ``scl/stl10_eval.py`` (``--preset sigmoid_cl``) against scikit-learn.
"""

from __future__ import annotations

import json
import math
from functools import partial
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
import yaml
from torch import nn

from cloc_lightning.data import MultiCropViews, OrdinalShapesDataModule
from cloc_lightning.data.transforms import IMAGENET_MEAN, IMAGENET_STD
from cloc_lightning.losses import SigmoidContrastiveLoss, sigmoid_contrastive_loss
from cloc_lightning.methods import ReLICModule
from cloc_lightning.nn.ema import scl_train_beta, scl_train_beta_horizon
from cloc_lightning.probe import PROBE_PRESETS, extract_features, logistic_regression_probe, probe_checkpoint, probe_settings
from tests.conftest import REPO, TINY_BACKBONE, cpu_trainer
from tests.references.schedules import scl_train_ema_coefficients
from tests.references.sigmoid import filtering_threshold, sigmoid_loop_reference

QUIET = dict(online_probe=False, knn_k=0)
SEED_CONFIGS = {"cifar10": 32, "stl10": 96}  # configs/relic/<name>.yaml reproduce the seed; their image size

pytestmark = pytest.mark.filterwarnings("ignore:.*self.trainer.*reference is not registered:UserWarning")


def _dm(views: MultiCropViews | None = None, **kw: object) -> OrdinalShapesDataModule:
    args: dict = dict(num_classes=4, train_size=64, val_size=16, test_size=16, batch_size=16, num_workers=0, drop_last=True)
    args.update(kw)
    return OrdinalShapesDataModule(train_views=views or MultiCropViews(2, 0), **args)


_trainer = partial(cpu_trainer, max_epochs=1, enable_checkpointing=False, num_sanity_val_steps=0, limit_val_batches=0)


def _config(name: str) -> dict:
    return yaml.safe_load((REPO / "configs" / "relic" / f"{name}.yaml").read_text())


# =============================================================================== 1. encoder BatchNorm
def _bn_layers(module: nn.Module) -> list[nn.modules.batchnorm._BatchNorm]:
    return [m for m in module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


def _bn_state(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in module.state_dict().items() if "running_" in k or "num_batches_tracked" in k}


class _ModeRecorder(ReLICModule):
    """Records, at every training step, whether any encoder BatchNorm is in training mode."""

    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)
        self.encoder_bn_training: list[bool] = []
        self.projector_bn_training: list[bool] = []
        self.online_equals_eval_forward: list[bool] = []

    def training_step(self, batch: object, batch_idx: int) -> torch.Tensor:
        self.encoder_bn_training.append(any(m.training for m in _bn_layers(self.backbone) + _bn_layers(self.target_encoder)))
        self.projector_bn_training.append(all(m.training for m in _bn_layers(self.projector) + _bn_layers(self.target_projector)))
        # reference: what the seed's constructed encoder computes -- BatchNorm with its running statistics
        x = batch[0][0][:4]
        frozen = _copy_in_eval(self.backbone)
        with torch.no_grad():
            self.online_equals_eval_forward.append(torch.allclose(self.backbone(x), frozen(x), atol=1e-6))
        return super().training_step(batch, batch_idx)


def _copy_in_eval(module: nn.Module) -> nn.Module:
    import copy

    return copy.deepcopy(module).eval()


@pytest.mark.slow  # long tier: a real multi-epoch fit (12 s of the fast tier, measured idle at 788d45e+)
def test_encoder_bn_frozen_stats_keeps_running_statistics_over_real_training_steps(tmp_path: Path) -> None:
    """``encoder_bn='frozen_stats'``: 2 epochs with validation in between (Lightning switches modes around it).

    The encoders' running statistics stay at their initial values (the seed's constructed
    encoder: eval-mode BatchNorm, never switched back), while the BatchNorm affine weights
    train and the projectors' BatchNorm (train mode in the seed too) use batch statistics.
    """
    L.seed_everything(0)
    m = _ModeRecorder(backbone=TINY_BACKBONE, encoder_bn="frozen_stats", update_beta_after_step=0, **QUIET)
    assert _bn_layers(m.backbone), "the test backbone must have BatchNorm layers"
    enc0, tgt0 = _bn_state(m.backbone), _bn_state(m.target_encoder)
    proj0 = _bn_state(m.projector)
    affine0 = [(bn, bn.weight.detach().clone(), bn.bias.detach().clone()) for bn in _bn_layers(m.backbone)]
    trainer = _trainer(tmp_path, max_epochs=2, limit_val_batches=1, check_val_every_n_epoch=1)
    trainer.fit(m, datamodule=_dm())
    assert trainer.global_step == 8 and len(m.encoder_bn_training) == 8
    assert not any(m.encoder_bn_training)  # every step, both epochs (after validation too)
    assert all(m.projector_bn_training)
    assert all(m.online_equals_eval_forward)
    for name, start in ((m.backbone, enc0), (m.target_encoder, tgt0)):
        for k, v in _bn_state(name).items():
            assert torch.equal(v, start[k]), k
    assert any(not torch.equal(v, proj0[k]) for k, v in _bn_state(m.projector).items() if "running_mean" in k)
    assert any(not torch.equal(bn.weight, w) or not torch.equal(bn.bias, b) for bn, w, b in affine0)  # gamma/beta trained
    m.train()  # a plain .train() keeps the encoders' BatchNorm in eval mode
    assert not any(b.training for b in _bn_layers(m.backbone)) and all(b.training for b in _bn_layers(m.projector))


def test_encoder_bn_train_default_moves_running_statistics(tmp_path: Path) -> None:
    """The default (the seed's ``train.py``): the encoders' BatchNorm layers train normally."""
    L.seed_everything(0)
    m = ReLICModule(backbone=TINY_BACKBONE, update_beta_after_step=0, **QUIET)
    assert m.hparams.encoder_bn == "train"
    enc0, tgt0 = _bn_state(m.backbone), _bn_state(m.target_encoder)
    _trainer(tmp_path, max_steps=3).fit(m, datamodule=_dm())
    moved = [k for k, v in _bn_state(m.backbone).items() if "running_mean" in k and not torch.equal(v, enc0[k])]
    assert moved and any(not torch.equal(v, tgt0[k]) for k, v in _bn_state(m.target_encoder).items() if "running_var" in k)
    with pytest.raises(ValueError, match="encoder_bn"):
        ReLICModule(backbone=TINY_BACKBONE, encoder_bn="eval", **QUIET)  # type: ignore[arg-type]


# =============================================================================== 2. penalty filtering
def _seed_loss_numpy(
    x: np.ndarray, xp: np.ndarray, tau: float, b: float, gamma: float, alpha: float, step: int, warmup: int, thr: float
) -> float:
    """The seed's ``scl_loss`` with ``penalty_filtering=True`` at ``global_step = step`` (the shared loop reference)."""
    return sigmoid_loop_reference(x, xp, tau, b, alpha=alpha, gamma=gamma, threshold=filtering_threshold(step, warmup, thr))[0]


def _central_differences(f, arr: np.ndarray, h: float = 1e-6) -> np.ndarray:
    grad = np.zeros_like(arr)
    for idx in np.ndindex(arr.shape):
        old = arr[idx]
        arr[idx] = old + h
        up = f()
        arr[idx] = old - h
        down = f()
        arr[idx] = old
        grad[idx] = (up - down) / (2 * h)
    return grad


@pytest.mark.parametrize("gamma", [1.0, 0.5, 2.0])
def test_penalty_filtering_matches_the_seed_value_gradients_and_boundary(gamma: float) -> None:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(7, 5, generator=g, dtype=torch.float64)
    xp = torch.randn(7, 5, generator=g, dtype=torch.float64)
    tau, b, thr, warmup = math.log(4.0), -1.0, 0.3, 50
    xa, xpa = x.numpy().copy(), xp.numpy().copy()
    for step in (warmup - 1, warmup, warmup + 1, 3 * warmup):
        ref = _seed_loss_numpy(xa, xpa, tau, b, gamma, 1.0, step, warmup, thr)
        xg, xpg = x.clone().requires_grad_(True), xp.clone().requires_grad_(True)
        tau_t = torch.tensor(tau, dtype=torch.float64, requires_grad=True)
        b_t = torch.tensor(b, dtype=torch.float64, requires_grad=True)
        loss, _ = sigmoid_contrastive_loss(
            xg,
            xpg,
            tau_t,
            b_t,
            alpha=1.0,
            gamma=gamma,
            global_step=step,
            penalty_filtering=True,
            filtering_warmup_steps=warmup,
            filtering_threshold=thr,
        )
        assert loss.item() == pytest.approx(ref, rel=1e-10), step
        loss.backward()

        def f(step: int = step) -> float:
            return _seed_loss_numpy(xa, xpa, tau, b, gamma, 1.0, step, warmup, thr)

        np.testing.assert_allclose(xg.grad.numpy(), _central_differences(f, xa), rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(xpg.grad.numpy(), _central_differences(f, xpa), rtol=1e-5, atol=1e-7)
        g_b = (
            _seed_loss_numpy(xa, xpa, tau, b + 1e-6, gamma, 1.0, step, warmup, thr)
            - _seed_loss_numpy(xa, xpa, tau, b - 1e-6, gamma, 1.0, step, warmup, thr)
        ) / 2e-6
        g_tau = (
            _seed_loss_numpy(xa, xpa, tau + 1e-6, b, gamma, 1.0, step, warmup, thr)
            - _seed_loss_numpy(xa, xpa, tau - 1e-6, b, gamma, 1.0, step, warmup, thr)
        ) / 2e-6
        assert b_t.grad.item() == pytest.approx(g_b, rel=1e-5) and tau_t.grad.item() == pytest.approx(g_tau, rel=1e-5)
    # the warm-up step itself is still the weighted loss; filtering (unweighted) starts one step later
    weighted = _seed_loss_numpy(xa, xpa, tau, b, gamma, 0.0, 0, warmup, thr)
    at_warmup = sigmoid_contrastive_loss(
        x, xp, tau, b, gamma=gamma, global_step=warmup, penalty_filtering=True, filtering_warmup_steps=warmup, filtering_threshold=thr
    )[0].item()
    after = sigmoid_contrastive_loss(
        x, xp, tau, b, gamma=gamma, global_step=warmup + 1, penalty_filtering=True, filtering_warmup_steps=warmup, filtering_threshold=thr
    )[0].item()
    assert at_warmup == pytest.approx(weighted, rel=1e-12) and after > at_warmup + 0.1


def test_penalty_filtering_drops_the_weight_of_kept_pairs_about_twice_the_loss_at_gamma_one() -> None:
    """Logit scale 1, bias 0: every sigmoid is near 1/2, every pair is kept (penalty > 0.05), and the
    unweighted filtered loss is about twice the weighted one at gamma = 1 (the issue's 3.37 vs 6.75)."""
    g = torch.Generator().manual_seed(0)
    x, xp = torch.randn(64, 16, generator=g), torch.randn(64, 16, generator=g)
    crit = SigmoidContrastiveLoss(
        init_tau=0.0, init_b=0.0, gamma=1.0, penalty_filtering=True, filtering_warmup_steps=10, filtering_threshold=0.05
    )
    weighted = crit(x, xp, global_step=10)
    filtered = crit(x, xp, global_step=11)
    ref = _seed_loss_numpy(x.double().numpy(), xp.double().numpy(), 0.0, 0.0, 1.0, 0.0, 11, 10, 0.05)
    assert filtered.item() == pytest.approx(ref, rel=1e-5)
    assert weighted.item() == pytest.approx(
        _seed_loss_numpy(x.double().numpy(), xp.double().numpy(), 0.0, 0.0, 1.0, 0.0, 10, 10, 0.05), rel=1e-5
    )
    assert 1.7 < filtered.item() / weighted.item() < 2.3


# =============================================================================== 3. normalisation
@pytest.mark.parametrize("name", sorted(SEED_CONFIGS))
def test_seed_configs_normalise_with_imagenet_statistics(name: str) -> None:
    from torchvision.transforms import v2

    data = _config(name)["data"]["init_args"]
    assert tuple(data["mean"]) == IMAGENET_MEAN and tuple(data["std"]) == IMAGENET_STD  # scl/aug.py Normalize
    views = MultiCropViews(**data["train_views"]["init_args"]).build(data["image_size"], data["mean"], data["std"])
    for pipeline in views.transforms:
        norm = [op for op in pipeline.transforms if isinstance(op, v2.Normalize)]
        assert len(norm) == 1 and tuple(norm[0].mean) == IMAGENET_MEAN and tuple(norm[0].std) == IMAGENET_STD


# =============================================================================== 4. multi-crop pipeline
def _seed_pipeline_values(image_size: int) -> dict:
    """The seed's ``scl/aug.py`` values for ``ViewGenerator(image_size, 2, 4)``, computed here."""
    tenth = int(image_size * 0.1)
    kernel = tenth if tenth % 2 == 1 else tenth + 1  # the next odd integer >= int(size / 10)
    common = dict(flip_p=0.5, jitter=(0.8, 0.8, 0.8, 0.2), jitter_p=0.8, gray_p=0.2, blur_kernel=kernel, blur_sigma=(0.1, 2.0), blur_p=1.0)
    return {
        "global": dict(common, size=image_size, scale=(0.1, 1.0), solarize=(127, 0.2)),
        "local": dict(common, size=int(image_size * 3 / 7), scale=(0.05, 1.0), solarize=None),
        "counts": (2, 4),
    }


def _pipeline_values(pipeline: object) -> dict:
    """Read the parameters back from a built torchvision v2 pipeline."""
    from torchvision.transforms import v2

    out: dict = {"solarize": None, "blur_p": None}
    for op in pipeline.transforms:  # type: ignore[attr-defined]
        if isinstance(op, v2.RandomResizedCrop):
            out["size"], out["scale"] = tuple(op.size), tuple(op.scale)
        elif isinstance(op, v2.RandomHorizontalFlip):
            out["flip_p"] = op.p
        elif isinstance(op, v2.RandomGrayscale):
            out["gray_p"] = op.p
        elif isinstance(op, v2.RandomSolarize):
            out["solarize"] = (op.threshold, op.p)
        elif isinstance(op, v2.RandomApply):
            inner = op.transforms[0]
            if isinstance(inner, v2.ColorJitter):
                # v2 stores brightness/contrast/saturation as (1 - f, 1 + f) and hue as (-h, h)
                out["jitter"] = (1 - inner.brightness[0], 1 - inner.contrast[0], 1 - inner.saturation[0], inner.hue[1])
                out["jitter_p"] = op.p
            elif isinstance(inner, v2.GaussianBlur):
                out["blur_kernel"] = inner.kernel_size[0]
                assert inner.kernel_size[0] == inner.kernel_size[1]
                out["blur_sigma"], out["blur_p"] = tuple(inner.sigma), op.p
        elif isinstance(op, v2.GaussianBlur):
            out["blur_kernel"], out["blur_sigma"], out["blur_p"] = op.kernel_size[0], tuple(op.sigma), 1.0
    return out


def _assert_matches_seed(transform: object, image_size: int) -> None:
    seed = _seed_pipeline_values(image_size)
    n_global, n_local = seed["counts"]
    pipelines = transform.transforms  # type: ignore[attr-defined]
    assert len(pipelines) == n_global + n_local
    for kind, group in (("global", pipelines[:n_global]), ("local", pipelines[n_global:])):
        want = seed[kind]
        for pipeline in group:
            got = _pipeline_values(pipeline)
            assert got["size"] == (want["size"], want["size"]), (kind, image_size)
            assert got["scale"] == pytest.approx(want["scale"]) and got["flip_p"] == want["flip_p"]
            assert got["jitter"] == pytest.approx(want["jitter"]) and got["jitter_p"] == want["jitter_p"]
            assert got["gray_p"] == want["gray_p"]
            assert got["blur_kernel"] == want["blur_kernel"], (kind, image_size)
            assert got["blur_sigma"] == pytest.approx(want["blur_sigma"]) and got["blur_p"] == want["blur_p"]
            assert got["solarize"] == want["solarize"], kind


@pytest.mark.parametrize("image_size", [32, 64, 96])
def test_multicrop_seed_options_build_the_seed_pipeline(image_size: int) -> None:
    views = MultiCropViews(num_local_views=4, blur_p=1.0, blur_kernel_from="global", local_size_rounding="floor", solarize_threshold=127)
    _assert_matches_seed(views.build(image_size, IMAGENET_MEAN, IMAGENET_STD), image_size)
    # the defaults differ from the seed where documented: blur p 0.5, threshold 128, kernel of each
    # crop, round(3/7 size), no local views
    default = MultiCropViews()
    assert (default.blur_p, default.solarize_threshold, default.blur_kernel_from, default.local_size_rounding, default.num_local_views) == (
        0.5,
        128,
        "crop",
        "round",
        0,
    )
    assert default.sizes(32) == (32, 14) and views.sizes(32) == (32, 13)
    assert default.blur_kernels(96) == (9, 5) and views.blur_kernels(96) == (9, 9)


@pytest.mark.parametrize("name", sorted(SEED_CONFIGS))
def test_seed_configs_build_the_seed_pipeline(name: str) -> None:
    data = _config(name)["data"]["init_args"]
    assert data["image_size"] == SEED_CONFIGS[name]
    views = MultiCropViews(**data["train_views"]["init_args"])
    _assert_matches_seed(views.build(data["image_size"], data["mean"], data["std"]), data["image_size"])


# =============================================================================== 5. beta schedule
@pytest.mark.parametrize("after,every", [(1, 1), (0, 1), (5, 2), (3, 3)])
def test_scl_train_beta_matches_the_seed_loop_over_a_grid_of_steps(after: int, every: int) -> None:
    loader_len, epochs, beta0 = 37, 11, 0.995
    total = loader_len * epochs
    horizon = scl_train_beta_horizon(loader_len, epochs, after)
    assert horizon == loader_len * (epochs + 2) - after
    seed = scl_train_ema_coefficients(total, loader_len, epochs, beta0, after, every)
    ema_steps = [k for k in seed if seed[k] > 0.0]
    assert ema_steps and ema_steps[0] == next(k for k in range(after + 1, total) if k % every == 0)
    for k in ema_steps:
        assert scl_train_beta(k, horizon, beta0, after, every) == pytest.approx(seed[k], rel=1e-12, abs=1e-15), k
    assert seed[ema_steps[0]] == beta0 and max(seed.values()) < 1.0  # the lag, and it never reaches 1


class _BetaRecorder(ReLICModule):
    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)
        self.used: dict[int, float] = {}

    def update_target(self, beta: float) -> None:
        self.used[self._pending_step] = beta
        super().update_target(beta)

    def copy_target(self) -> None:
        self.used[self._pending_step] = 0.0
        super().copy_target()


@pytest.mark.slow  # long tier: a real multi-epoch fit (51 s of the fast tier, measured idle at 788d45e+)
@pytest.mark.parametrize("every", [1, 2])
def test_scl_train_beta_schedule_in_a_real_fit(tmp_path: Path, every: int) -> None:
    """4 batches per epoch, 3 epochs: the coefficients a Trainer applies equal the seed loop's."""
    L.seed_everything(0)
    m = _BetaRecorder(
        backbone=TINY_BACKBONE,
        beta=0.9,
        beta_schedule="scl_train",
        update_beta_after_step=1,
        update_beta_every_n_steps=every,
        projector_hidden_dim=16,
        projector_dim=8,
        **QUIET,
    )
    trainer = _trainer(tmp_path, max_epochs=3)
    trainer.fit(m, datamodule=_dm(MultiCropViews(2, 0)))
    assert trainer.global_step == 12 and m.beta_horizon() == 4 * 5 - 1
    seed = scl_train_ema_coefficients(12, 4, 3, 0.9, 1, every)
    assert set(m.used) == set(seed)
    for k, v in seed.items():
        assert m.used[k] == pytest.approx(v, rel=1e-12), k
    # ours (relic): no lag, horizon = the run, 1 at the end
    relic = ReLICModule(backbone=TINY_BACKBONE, beta=0.9, **QUIET)
    assert relic.hparams.beta_schedule == "relic"
    with pytest.raises(ValueError, match="beta_schedule"):
        ReLICModule(backbone=TINY_BACKBONE, beta_schedule="byol", **QUIET)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", sorted(SEED_CONFIGS))
def test_seed_configs_use_the_seed_schedule_and_bn_mode(name: str) -> None:
    args = _config(name)["model"]["init_args"]
    assert args["beta_schedule"] == "scl_train" and args["encoder_bn"] == "train"
    assert (args["update_beta_after_step"], args["update_beta_every_n_steps"]) == (1, 1)
    assert args["backbone_init"] == "kaiming" and args["penalty_filtering"] is False


# =============================================================================== 6. linear probe
def _seed_probe(train_X: np.ndarray, train_y: np.ndarray, test_X: np.ndarray, test_y: np.ndarray) -> tuple[float, np.ndarray]:
    """``scl/stl10_eval.py``: CalibratedClassifierCV(LogisticRegression(max_iter=100)), sklearn called directly."""
    import warnings

    from sklearn.calibration import CalibratedClassifierCV
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression

    clf = CalibratedClassifierCV(LogisticRegression(max_iter=100))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf.fit(np.asarray(train_X, dtype=np.float64), train_y)
    pred = clf.predict(np.asarray(test_X, dtype=np.float64))
    return float((pred == test_y).mean()), clf.predict_proba(np.asarray(train_X, dtype=np.float64))


def _l2(a: np.ndarray) -> np.ndarray:
    """Row L2 normalisation in float32 torch, as the seed (``F.normalize(features, p=2, dim=-1)``)."""
    return torch.nn.functional.normalize(torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)), p=2, dim=-1).numpy()


def test_sigmoid_cl_probe_preset_equals_sklearn_with_the_seeds_settings() -> None:
    assert probe_settings("sigmoid_cl") == {"C": 1.0, "max_iter": 100, "normalize": True, "standardize": False, "calibrated": True}
    assert probe_settings() == PROBE_PRESETS["default"] and probe_settings("sigmoid_cl", max_iter=7)["max_iter"] == 7
    with pytest.raises(ValueError, match="preset"):
        probe_settings("seed_v2")
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(4, 12))
    y = rng.integers(0, 4, size=260)
    X = _l2(centres[y] + 1.5 * rng.normal(size=(260, 12))).astype(np.float32)
    s = probe_settings("sigmoid_cl")
    ours = logistic_regression_probe(
        X[:200], y[:200], X[200:], y[200:], C=s["C"], max_iter=s["max_iter"], standardize=s["standardize"], calibrated=s["calibrated"]
    )
    top1, _ = _seed_probe(X[:200], y[:200], X[200:], y[200:])
    assert ours["top1"] == top1 and 0.4 < top1 < 1.0


@pytest.fixture(scope="module")
def relic_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("relic")
    L.seed_everything(0)
    model = ReLICModule(backbone=TINY_BACKBONE, projector_hidden_dim=16, projector_dim=8, **QUIET)
    trainer = _trainer(root, max_steps=3, enable_checkpointing=True)
    trainer.fit(model, datamodule=_dm())
    return Path(trainer.checkpoint_callback.last_model_path)


def _probe_data() -> OrdinalShapesDataModule:
    return OrdinalShapesDataModule(num_classes=4, train_size=96, val_size=16, test_size=48, batch_size=16, num_workers=0, noise=2.0)


def test_probe_checkpoint_and_cli_preset_sigmoid_cl_equal_sklearn_on_target_features(relic_ckpt: Path, tmp_path: Path) -> None:
    from cloc_lightning.cli import main

    dm = _probe_data()
    res = probe_checkpoint(str(relic_ckpt), dm, preset="sigmoid_cl")
    assert res["preset"] == "sigmoid_cl" and res["settings"]["calibrated"] and "target_encoder." in res["encoder"]
    # reference: the target encoder (as the seed's get_features / save_encoder), L2-normalised features, sklearn
    encoder = ReLICModule.load_from_checkpoint(relic_ckpt).target_encoder.eval()
    train_X, train_y = extract_features(encoder, dm.train_eval_dataloader())
    test_X, test_y = extract_features(encoder, dm.test_dataloader())
    top1, _ = _seed_probe(_l2(train_X), train_y, _l2(test_X), test_y)
    assert res["top1"] == pytest.approx(top1, abs=1e-12)
    # the command line reaches the same preset
    out = tmp_path / "probe.json"
    main(
        [
            "probe",
            "--preset",
            "sigmoid_cl",
            "--ckpt",
            str(relic_ckpt),
            "--data",
            "OrdinalShapesDataModule",
            "--data.num_classes",
            "4",
            "--data.train_size",
            "96",
            "--data.val_size",
            "16",
            "--data.test_size",
            "48",
            "--data.batch_size",
            "16",
            "--data.num_workers",
            "0",
            "--data.noise",
            "2.0",
            "--output",
            str(out),
        ]
    )
    cli = json.loads(out.read_text())
    assert cli["top1"] == pytest.approx(top1, abs=1e-12) and cli["settings"] == probe_settings("sigmoid_cl")
