"""ReLICModule: its EMA target over a fit, schedules, multi-crop pairs, mini-batch splitting, CLI and probe.

The EMA update itself (parameters and BatchNorm buffers): ``tests/nn/test_ema.py``.
"""

from __future__ import annotations

import itertools
import math
from functools import partial
from pathlib import Path

import lightning as L
import pytest
import torch
from torch import nn

from cloc_lightning.checkpoints import ENCODER_META_KEY
from cloc_lightning.data import MultiCropViews, OrdinalShapesDataModule, SupConViews
from cloc_lightning.losses.sigmoid import sigmoid_contrastive_loss
from cloc_lightning.methods import LinearProbeModule, ReLICModule
from cloc_lightning.methods.relic import cosine_gamma
from cloc_lightning.nn.ema import cosine_beta
from tests._reliability import RELIC_ARGS, SMALL, _fit, _relic_views, _shapes
from tests.conftest import REPO, TINY_BACKBONE, cpu_trainer, run_cli

QUIET = dict(online_probe=False, knn_k=0)

pytestmark = pytest.mark.filterwarnings("ignore:.*self.trainer.*reference is not registered:UserWarning")


def _dm(views: object | None = None, **kw: object) -> OrdinalShapesDataModule:
    args: dict = dict(num_classes=4, train_size=64, val_size=16, test_size=16, batch_size=16, num_workers=0, drop_last=True)
    args.update(kw)
    return OrdinalShapesDataModule(train_views=views if views is not None else MultiCropViews(2, 1, local_size=16), **args)


_trainer = partial(cpu_trainer, max_epochs=1, log_every_n_steps=1, num_sanity_val_steps=0, limit_val_batches=0)


class _ConvReLIC(ReLICModule):
    """A BatchNorm-free encoder (the projector keeps its BatchNorm1d) for exact gradient comparisons."""

    def build_backbone(self) -> tuple[nn.Module, int]:
        return nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten()), 6


def _pair_mean_reference(online: list[torch.Tensor], target: list[torch.Tensor], m: ReLICModule, gamma: float) -> torch.Tensor:
    """Mean over (target i, online j != i) of the loss, pairs enumerated by hand (not with view_pairs)."""
    crit = m.criterion
    terms = []
    for i in range(len(target)):
        for j in range(len(online)):
            if i != j:
                loss, _ = sigmoid_contrastive_loss(
                    online[j], target[i], crit.tau, crit.b, alpha=crit.alpha, max_tau=crit.max_tau, gamma=gamma
                )
                terms.append(loss)
    return torch.stack(terms).mean()


def _target_is_online(m: ReLICModule) -> bool:
    return all(
        torch.equal(o, t)
        for o, t in zip(
            [*m.backbone.state_dict().values(), *m.projector.state_dict().values()],
            [*m.target_encoder.state_dict().values(), *m.target_projector.state_dict().values()],
            strict=True,
        )
    )


class _CallbackView(L.Callback):
    """What a callback (e.g. ModelCheckpoint saving a step checkpoint) sees at the end of a batch."""

    def __init__(self) -> None:
        self.record: list[tuple[int, bool]] = []

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: object) -> None:
        self.record.append((trainer.global_step, _target_is_online(pl_module)))  # type: ignore[arg-type]


class _Recording(ReLICModule):
    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)
        self.record: list[tuple[int, bool]] = []
        self.updates: list[int] = []
        self.start_target: dict[str, torch.Tensor] = {}

    def _target_after_step(self, step: int) -> None:
        self.updates.append(step)
        super()._target_after_step(step)

    def on_train_start(self) -> None:
        super().on_train_start()
        self.start_target = {k: v.clone() for k, v in self.state_dict().items() if k.startswith("target_")}

    def on_train_batch_end(self, outputs: object, batch: object, batch_idx: int) -> None:
        super().on_train_batch_end(outputs, batch, batch_idx)
        self.record.append((int(self.trainer.global_step), _target_is_online(self)))


def test_target_copies_online_until_update_beta_after_step_and_moves_after_optimizer_steps_only(tmp_path: Path) -> None:
    L.seed_everything(0)
    accumulate = 2
    m = _Recording(backbone=TINY_BACKBONE, beta=0.5, update_beta_after_step=1, **QUIET)
    seen_by_callbacks = _CallbackView()
    trainer = _trainer(tmp_path, accumulate_grad_batches=accumulate, max_steps=4, callbacks=[seen_by_callbacks])
    trainer.fit(m, datamodule=_dm(MultiCropViews(2, 0), train_size=128))
    # callbacks run before the module's on_train_batch_end: the target is already updated for the step
    # (a step checkpoint holds it, so a resume from it continues exactly)
    assert seen_by_callbacks.record == m.record
    assert m.updates == [0, 1, 2, 3]  # once per optimiser step, never after an accumulation-only batch
    assert [s for s, _ in m.record] == [(b + 1) // accumulate for b in range(4 * accumulate)]
    for step, same in m.record:
        if step <= 2:  # before any step, or after steps k = 0, 1 <= update_beta_after_step: an exact copy
            assert same, step
        else:  # EMA with beta < 1 while the online network keeps moving
            assert not same, step
    logged = trainer.callback_metrics
    for key in ("train/loss", "train/invariance", "train/beta", "train/gamma", "train/tau", "train/b", "train/logit_scale"):
        assert key in logged and math.isfinite(float(logged[key])), key
    assert float(logged["train/beta"]) == pytest.approx(cosine_beta(3, 4, 0.5))


# ------------------------------------------------------------------- schedules
def test_beta_and_gamma_schedules_end_points_monotone_and_seed_formula() -> None:
    total, beta0 = 50, 0.99
    betas = [cosine_beta(k, total, beta0) for k in range(total + 5)]
    assert betas[0] == pytest.approx(beta0) and betas[total] == pytest.approx(1.0) and betas[-1] == pytest.approx(1.0)
    assert all(b2 >= b1 for b1, b2 in itertools.pairwise(betas))
    for k in (7, 25, 40):  # ReLIC/BYOL: 1 - (1 - b0) (cos(pi k / K) + 1) / 2
        assert betas[k] == pytest.approx(1 - (1 - beta0) * (math.cos(math.pi * k / total) + 1) / 2)
    steps, gamma0 = 30, 2.0
    gammas = [cosine_gamma(k, steps, gamma0) for k in range(steps + 5)]
    assert gammas[0] == pytest.approx(gamma0) and gammas[steps] == 0.0 and gammas[-1] == 0.0
    assert all(g2 <= g1 for g1, g2 in itertools.pairwise(gammas))
    for k in (3, 15, 29):  # the seed's cosine_scaling_gamma(k, gamma0, 0, steps)
        assert gammas[k] == pytest.approx((math.cos(math.pi * k / steps) / 2 + 0.5) * gamma0)
    fixed = ReLICModule(backbone=TINY_BACKBONE, gamma=1.5, use_gamma_scaling=False, **QUIET)
    scheduled = ReLICModule(backbone=TINY_BACKBONE, gamma=1.5, use_gamma_scaling=True, gamma_scaling_steps=10, **QUIET)
    assert [fixed.gamma_at(k) for k in (0, 5, 100)] == [1.5, 1.5, 1.5]
    assert scheduled.gamma_at(0) == pytest.approx(1.5) and scheduled.gamma_at(5) == pytest.approx(0.75)
    assert scheduled.gamma_at(10) == 0.0


# ------------------------------------------------------------------ multi-crop
@pytest.mark.parametrize("n_global,n_local", [(1, 1), (2, 0), (2, 4), (3, 2)])
def test_multicrop_pairs_loss_and_target_sees_global_views_only(n_global: int, n_local: int) -> None:
    torch.manual_seed(0)
    m = ReLICModule(backbone=TINY_BACKBONE, num_global_views=n_global, num_local_views=n_local, **QUIET)
    pairs = m.view_pairs()
    assert len(pairs) == n_global * (n_global + n_local) - n_global
    assert len(set(pairs)) == len(pairs) and all(i < n_global and i != j < n_global + n_local for i, j in pairs)
    views = [torch.randn(6, 3, 32, 32) for _ in range(n_global)] + [torch.randn(6, 3, 16, 16) for _ in range(n_local)]
    seen: dict[str, list[int]] = {"online": [], "target": []}
    hooks = [
        m.backbone.register_forward_pre_hook(lambda mod, a: seen["online"].append(a[0].shape[-1])),
        m.target_encoder.register_forward_pre_hook(lambda mod, a: seen["target"].append(a[0].shape[-1])),
    ]
    loss = m.training_step((views, torch.zeros(6, dtype=torch.long)), 0)
    for h in hooks:
        h.remove()
    assert seen["target"] == [32] * n_global  # the target never sees a local (16 px) view
    assert sorted(seen["online"]) == sorted([32] * n_global + [16] * n_local)
    with torch.no_grad():
        online = [m.online_projection(v) for v in views]
        target = [m.target_outputs(v)[1] for v in views[:n_global]]
        expected = _pair_mean_reference(online, target, m, gamma=1.0)
    assert torch.allclose(loss.detach(), expected, rtol=1e-5, atol=1e-6)


def test_wrong_view_count_names_the_fix(tmp_path: Path) -> None:
    m = ReLICModule(backbone=TINY_BACKBONE, num_global_views=2, num_local_views=2, **QUIET)
    views = [torch.randn(4, 3, 32, 32) for _ in range(3)]
    with pytest.raises(ValueError, match=r"expects 4 views.*has 3.*MultiCropViews.*num_local_views: 2"):
        m.training_step((views, torch.zeros(4, dtype=torch.long)), 0)
    with pytest.raises(ValueError, match=r"multi-view|multi-crop"):
        m.training_step((torch.randn(4, 3, 32, 32), torch.zeros(4, dtype=torch.long)), 0)
    with pytest.raises(ValueError, match=r"yields 2 views.*MultiCropViews"):
        _trainer(tmp_path).fit(m, datamodule=_dm(SupConViews(2)))
    with pytest.raises(ValueError, match=r"MultiCropViews.*\(2, 1\).*num_local_views: 2"):  # same total, other split
        _trainer(tmp_path).fit(
            ReLICModule(backbone=TINY_BACKBONE, num_global_views=1, num_local_views=2, **QUIET),
            datamodule=_dm(MultiCropViews(2, 1, local_size=16)),
        )
    with pytest.raises(ValueError, match="at least two views"):
        ReLICModule(backbone=TINY_BACKBONE, num_global_views=1, num_local_views=0)
    with pytest.raises(ValueError, match="negatives"):
        ReLICModule(backbone=TINY_BACKBONE, mini_batch_size=4, negatives="half")  # type: ignore[arg-type]


# --------------------------------------------------------------- mini-batches
def _chunked_reference(m: ReLICModule, views: list[torch.Tensor], chunk: int, per_chunk_bn: bool):
    """Online/target projections of the whole batch; with ``per_chunk_bn`` each chunk is forwarded alone."""
    n = views[0].shape[0]
    slices = [slice(i, i + chunk) for i in range(0, n, chunk)] if per_chunk_bn else [slice(0, n)]
    # chunk-major order, as the module forwards them (BatchNorm running statistics depend on the order)
    target_parts = [[m.target_outputs(v[s])[1] for v in views[: m.num_global_views]] for s in slices]
    online_parts = [[m.online_projection(v[s]) for v in views] for s in slices]
    online = [torch.cat([part[j] for part in online_parts]) for j in range(len(views))]
    target = [torch.cat([part[i] for part in target_parts]) for i in range(m.num_global_views)]
    return online, target, slices


class _DropoutReLIC(_ConvReLIC):
    """A projector with dropout: the re-forward of gradient caching must replay the same masks."""

    def build_projector(self) -> nn.Module:
        return nn.Sequential(nn.Linear(self.feature_dim, 16), nn.ReLU(), nn.Dropout(0.5), nn.Linear(16, 8))


@pytest.mark.parametrize("mode", ["eval", "train", "dropout"])
def test_full_batch_negatives_give_the_whole_batch_gradients(mode: str) -> None:
    torch.manual_seed(0)
    cls = _DropoutReLIC if mode == "dropout" else _ConvReLIC
    kw = dict(num_global_views=2, num_local_views=1, projector_hidden_dim=16, projector_dim=8, alpha=1.0, **QUIET)
    ref, chunked = cls(**kw), cls(mini_batch_size=4, negatives="full_batch", **kw)
    chunked.load_state_dict(ref.state_dict())
    ref.train(mode != "eval"), chunked.train(mode != "eval")
    views = [torch.randn(12, 3, 8, 8), torch.randn(12, 3, 8, 8), torch.randn(12, 3, 5, 5)]
    # eval mode: the plain whole-batch loss; train mode: BatchNorm1d statistics per chunk, as the chunked run has
    # them; dropout: the same random masks, drawn in the module's order (targets, then online chunk by chunk)
    torch.manual_seed(5)
    online, target, _ = _chunked_reference(ref, views, 4, per_chunk_bn=mode != "eval")
    expected = _pair_mean_reference(online, target, ref, gamma=0.5)
    expected.backward()
    torch.manual_seed(5)
    loss, inv, _ = chunked.accumulate_gradients(views, torch.zeros(12, dtype=torch.long), gamma=0.5, step=0)
    assert torch.allclose(loss, expected.detach(), rtol=1e-5) and math.isfinite(float(inv))
    grads = dict(ref.named_parameters())
    for name, p in chunked.named_parameters():
        if p.requires_grad:
            assert p.grad is not None and torch.allclose(p.grad, grads[name].grad, rtol=1e-4, atol=1e-6), name
    for (name, a), b in zip(chunked.named_buffers(), ref.buffers(), strict=True):  # BN statistics updated once per chunk, not twice
        assert torch.allclose(a.float(), b.float(), atol=1e-6), name


def test_mini_batch_negatives_average_the_chunk_losses_and_bad_sizes_fail(tmp_path: Path) -> None:
    torch.manual_seed(1)
    kw = dict(num_global_views=2, num_local_views=0, projector_hidden_dim=16, projector_dim=8, **QUIET)
    ref, chunked = _ConvReLIC(**kw), _ConvReLIC(mini_batch_size=3, negatives="mini_batch", **kw)
    chunked.load_state_dict(ref.state_dict())
    views = [torch.randn(9, 3, 8, 8), torch.randn(9, 3, 8, 8)]
    online, target, slices = _chunked_reference(ref, views, 3, per_chunk_bn=True)
    expected = torch.stack(
        [_pair_mean_reference([o[s] for o in online], [t[s] for t in target], ref, gamma=1.0) for s in slices]
    ).mean()  # each chunk contrasted with its own 3 target rows only (the seed's mini-batches)
    expected.backward()
    loss, _, _ = chunked.accumulate_gradients(views, torch.zeros(9, dtype=torch.long), gamma=1.0, step=0)
    assert torch.allclose(loss, expected.detach(), rtol=1e-5)
    grads = dict(ref.named_parameters())
    for name, p in chunked.named_parameters():
        if p.requires_grad:
            assert torch.allclose(p.grad, grads[name].grad, rtol=1e-4, atol=1e-6), name
    chunked.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):  # as inside a bf16-mixed training_step: backward leaves autocast
        loss16, _, _ = chunked.accumulate_gradients(views, torch.zeros(9, dtype=torch.long), gamma=1.0, step=0)
    assert torch.allclose(loss16, expected.detach(), rtol=0.05)
    assert all(torch.isfinite(p.grad).all() for p in chunked.parameters() if p.requires_grad)
    with pytest.raises(ValueError, match="does not divide the batch of 8"):
        chunked.accumulate_gradients([v[:8] for v in views], torch.zeros(8, dtype=torch.long))
    with pytest.raises(ValueError, match=r"mini_batch_size=5 does not divide data.batch_size=16"):
        _trainer(tmp_path).fit(ReLICModule(backbone=TINY_BACKBONE, num_local_views=1, mini_batch_size=5, **QUIET), datamodule=_dm())
    with pytest.raises(ValueError, match="mini_batch_size must be a positive integer"):
        ReLICModule(backbone=TINY_BACKBONE, mini_batch_size=0)


# ------------------------------------------------------------------ subclass
def test_user_subclass_with_own_projector() -> None:
    class LinearHeadReLIC(ReLICModule):
        def build_projector(self) -> nn.Module:
            return nn.Linear(self.feature_dim, 16, bias=False)

    m = LinearHeadReLIC(backbone=TINY_BACKBONE, **QUIET)
    assert isinstance(m.projector, nn.Linear) and isinstance(m.target_projector, nn.Linear)
    assert m.target_projector is not m.projector and not m.target_projector.weight.requires_grad
    views = [torch.randn(4, 3, 32, 32), torch.randn(4, 3, 32, 32)]
    assert m.online_projection(views[0]).shape == (4, 16)
    loss = m.training_step((views, torch.zeros(4, dtype=torch.long)), 0)
    loss.backward()
    assert math.isfinite(float(loss.detach())) and m.projector.weight.grad is not None and m.criterion.tau.grad is not None
    feats = m.extract_features(views[0])
    assert feats.shape == (4, m.feature_dim) and torch.allclose(feats.norm(dim=1), torch.ones(4), atol=1e-5)


# -------------------------------------------------------- precision, resume
@pytest.mark.parametrize("mini_batch_size", [None, 8])
def test_bf16_mixed_fit_stays_finite_and_resume_restores_the_target(tmp_path: Path, mini_batch_size: int | None) -> None:
    """bf16-mixed with and without mini-batches (manual optimisation); resume checked on the automatic path."""
    L.seed_everything(0)
    # local views at 32 px: a stride-2 conv on 1x1 maps (test_resnet on 16 px) gives NaN weight
    # gradients in PyTorch's CPU bf16 kernels, independently of this module (see the note)
    views = MultiCropViews(2, 1, local_size=32)
    m = ReLICModule(
        backbone=TINY_BACKBONE,
        num_local_views=1,
        update_beta_after_step=0,
        mini_batch_size=mini_batch_size,
        negatives="full_batch",
        num_classes=4,
        task="ordinal",
    )
    trainer = _trainer(tmp_path, precision="bf16-mixed", max_steps=3, limit_val_batches=1)
    trainer.fit(m, datamodule=_dm(views, train_size=48))  # one epoch of 3 steps, then validation
    assert trainer.global_step == 3
    assert math.isfinite(float(trainer.callback_metrics["train/loss"]))
    assert math.isfinite(float(trainer.callback_metrics["val/online_probe/loss"]))
    assert all(torch.isfinite(t).all() for t in m.state_dict().values() if t.is_floating_point())
    if mini_batch_size is not None:
        return
    ckpt = tmp_path / "step3.ckpt"
    trainer.save_checkpoint(ckpt)
    raw = torch.load(ckpt, map_location="cpu", weights_only=False)
    assert raw[ENCODER_META_KEY]["prefix"] == "target_encoder."
    saved = {k: v for k, v in raw["state_dict"].items() if k.startswith("target_")}
    assert saved and any(
        not torch.equal(v, raw["state_dict"][k.replace("target_encoder.", "backbone.", 1)])
        for k, v in saved.items()
        if k.startswith("target_encoder.") and v.is_floating_point()
    )
    resumed = _Recording(
        backbone=TINY_BACKBONE,
        num_local_views=1,
        update_beta_after_step=0,
        mini_batch_size=mini_batch_size,
        negatives="full_batch",
        num_classes=4,
        task="ordinal",
    )
    _trainer(tmp_path, max_epochs=2, max_steps=4, limit_val_batches=0).fit(resumed, datamodule=_dm(views, train_size=48), ckpt_path=ckpt)
    assert resumed.start_target.keys() == saved.keys()
    assert all(torch.equal(resumed.start_target[k], v) for k, v in saved.items())  # the target came back from the checkpoint
    assert resumed.updates == [3]  # and the EMA resumed at the next optimiser step


# ------------------------------------------------------------------ CLI + probe
@pytest.mark.slow  # a CLI subprocess run: the long tier (pytest -m slow)
def test_cli_fit_validate_test_and_offline_probe_on_the_target_encoder(tmp_path: Path) -> None:
    shrink = [
        "--data.train_size",
        "64",
        "--data.val_size",
        "32",
        "--data.test_size",
        "32",
        "--data.batch_size",
        "32",
        "--trainer.max_epochs",
        "1",
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.enable_model_summary",
        "false",
        "--model.mini_batch_size",
        "16",
        "--model.negatives",
        "full_batch",
    ]
    config = str(REPO / "configs" / "relic" / "demo.yaml")
    out = run_cli(["fit", "--config", config, *shrink], tmp_path)  # demo.yaml tests the best checkpoint after fit
    assert "test/online_probe/acc" in out.stdout
    ckpt = tmp_path / "runs" / "relic_demo" / "version_0" / "checkpoints" / "last.ckpt"
    assert ckpt.is_file()
    val = run_cli(["validate", "--config", config, *shrink, "--ckpt_path", str(ckpt)], tmp_path)
    assert "val/online_probe/acc" in val.stdout
    probe = run_cli(
        [
            "probe",
            "--ckpt",
            str(ckpt),
            "--normalize",
            "true",
            "--data",
            "OrdinalShapesDataModule",
            "--data.num_classes",
            "6",
            "--data.train_size",
            "64",
            "--data.test_size",
            "32",
            "--data.num_workers",
            "0",
        ],
        tmp_path,
    )
    assert "'target_encoder.'" in probe.stdout and "top1:" in probe.stdout
    # stage two reads the same (target) encoder
    raw = torch.load(ckpt, map_location="cpu", weights_only=False)["state_dict"]
    lp = LinearProbeModule(num_classes=6, encoder_ckpt=str(ckpt), normalize_features=True)
    for k, v in lp.backbone.state_dict().items():
        assert torch.equal(v, raw[f"target_encoder.{k}"]), k


# ------------------------------------------------------------------ DDP (2 gloo processes)
def _ddp_mini_batches(rank: int, world_size: int, work: str) -> dict:
    """Each rank: (1) gradients of its half of a fixed batch, mini-batched with full-batch negatives;
    (2) a Lightning fit with strategy='ddp' and mini_batch_size (manual optimisation, DDP sync on the last chunk)."""
    import os

    os.environ.update({"LOCAL_RANK": str(rank), "RANK": str(rank), "NODE_RANK": "0", "WORLD_SIZE": str(world_size)})
    torch.manual_seed(0)
    kw = dict(num_global_views=2, num_local_views=1, projector_hidden_dim=16, projector_dim=8, **QUIET)
    m = _ConvReLIC(mini_batch_size=2, negatives="full_batch", **kw).eval()
    g = torch.Generator().manual_seed(1)
    views = [torch.randn(8, 3, 8, 8, generator=g), torch.randn(8, 3, 8, 8, generator=g), torch.randn(8, 3, 5, 5, generator=g)]
    mine = slice(4 * rank, 4 * rank + 4)
    loss, _, _ = m.accumulate_gradients([v[mine] for v in views], torch.zeros(4, dtype=torch.long), gamma=1.0, step=0)
    grads = {}
    for name, p in m.named_parameters():
        if p.requires_grad:  # what DDP does: the mean over ranks
            grad = p.grad.clone()
            torch.distributed.all_reduce(grad)
            grads[name] = grad / world_size
    torch.distributed.all_reduce(loss)
    L.seed_everything(0)
    model = ReLICModule(
        backbone=TINY_BACKBONE,
        num_local_views=1,
        mini_batch_size=4,
        negatives="full_batch",
        update_beta_after_step=0,
        projector_hidden_dim=32,
        projector_dim=16,
        num_classes=4,
        task="ordinal",
    )
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_steps=2,
        limit_val_batches=1,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=work,
    )
    trainer.fit(model, datamodule=_dm(MultiCropViews(2, 1, local_size=16), batch_size=8, train_size=32))
    return {
        "loss": float(loss) / world_size,
        "grads": grads,
        "state": {k: v.clone() for k, v in model.state_dict().items()},
        "step": trainer.global_step,
    }


@pytest.mark.slow
@pytest.mark.ddp
def test_mini_batches_under_ddp_match_one_process_and_keep_ranks_in_sync(tmp_path: Path) -> None:
    from tests._ddp import run_distributed

    ranks = run_distributed(_ddp_mini_batches, 2, str(tmp_path))
    torch.manual_seed(0)
    kw = dict(num_global_views=2, num_local_views=1, projector_hidden_dim=16, projector_dim=8, **QUIET)
    ref = _ConvReLIC(**kw).eval()  # one process, the whole batch of 8, no mini-batches
    g = torch.Generator().manual_seed(1)
    views = [torch.randn(8, 3, 8, 8, generator=g), torch.randn(8, 3, 8, 8, generator=g), torch.randn(8, 3, 5, 5, generator=g)]
    expected = _pair_mean_reference(
        [ref.online_projection(v) for v in views], [ref.target_outputs(v)[1] for v in views[:2]], ref, gamma=1.0
    )
    expected.backward()
    assert ranks[0]["loss"] == pytest.approx(float(expected.detach()), rel=1e-5)
    for name, p in ref.named_parameters():
        if p.requires_grad:
            for r in ranks:
                assert torch.allclose(r["grads"][name], p.grad, rtol=1e-4, atol=1e-6), name
    assert ranks[0]["step"] == ranks[1]["step"] == 2
    for k, v in ranks[0]["state"].items():  # trainable weights, the EMA target and tau/b agree across ranks
        if k.startswith(("backbone.", "projector.", "criterion.", "target_")) and v.is_floating_point() and "running" not in k:
            assert torch.equal(v, ranks[1]["state"][k]), k


# ------------------------------------------------------------------ configs, transforms
@pytest.mark.parametrize("name", ["demo", "cifar10_cpu", "cifar10", "stl10"])
def test_configs_instantiate_with_matching_views(name: str) -> None:
    import importlib

    import yaml

    cfg = yaml.safe_load((REPO / "configs" / "relic" / f"{name}.yaml").read_text())
    model_cfg, data_cfg = cfg["model"], cfg["data"]
    assert model_cfg["class_path"] == "cloc_lightning.methods.ReLICModule"
    args = dict(model_cfg["init_args"])
    views_cfg = data_cfg["init_args"]["train_views"]
    assert views_cfg["class_path"] == "cloc_lightning.data.MultiCropViews"
    views = MultiCropViews(**views_cfg["init_args"])
    assert (views.num_global_views, views.num_local_views) == (args["num_global_views"], args["num_local_views"])
    module, _, cls = data_cfg["class_path"].rpartition(".")
    data_args = {k: v for k, v in data_cfg["init_args"].items() if k != "train_views"}
    dm = getattr(importlib.import_module(module), cls)(train_views=views, **data_args)
    assert dm.n_views == args["num_global_views"] + args["num_local_views"]
    if name in ("cifar10", "stl10"):  # the seed's settings
        assert (args["optimizer"], args["lr"], args["weight_decay"], args["beta"], args["alpha"], args["gamma"]) == (
            "adam",
            0.0003,
            0.00001,
            0.99,
            1.0,
            1.0,
        )
        assert (args["projector_hidden_dim"], args["projector_dim"], dm.batch_size) == (512, 64, 256)
        assert cfg["trainer"]["precision"] == "16-mixed" and args["scheduler"] == "none"
        return  # (ResNet-18/50 construction is not needed to check the settings)
    model = ReLICModule(**args)
    assert model.num_views == dm.n_views


def test_multicrop_views_seed_blur_kernel_and_solarize_threshold() -> None:
    from torchvision.transforms import v2

    views = MultiCropViews(2, 3, local_size=13, blur_p=1.0, blur_kernel_size=3, solarize_threshold=127)
    transform = views.build(32, (0.0, 0.0, 0.0), (1.0, 1.0, 1.0))
    out = transform(torch.randint(0, 256, (3, 32, 32), dtype=torch.uint8))
    assert [tuple(v.shape) for v in out] == [(3, 32, 32)] * 2 + [(3, 13, 13)] * 3

    def find(t: object, kind: type) -> list:
        found = []
        for op in getattr(t, "transforms", []):
            if isinstance(op, kind):
                found.append(op)
            found += find(op, kind)
        return found

    blurs = [b for t in transform.transforms for b in find(t, v2.GaussianBlur)]
    assert len(blurs) == 5 and all(list(b.kernel_size) == [3, 3] for b in blurs)
    solarize = [s for t in transform.transforms for s in find(t, v2.RandomSolarize)]
    assert len(solarize) == 2 and all(s.threshold == 127 for s in solarize)  # global views only
    with pytest.raises(ValueError, match="odd positive"):
        MultiCropViews(blur_kernel_size=4)


# ------------------------------------------------------------------ bad input
def test_relic_mini_batch_size_not_dividing_the_batch(tmp_path: Path) -> None:
    relic = ReLICModule(num_classes=4, task="ordinal", mini_batch_size=3, **RELIC_ARGS, **SMALL)
    with pytest.raises(ValueError, match=r"mini_batch_size=3 does not divide data.batch_size=8.*e\.g\. 2"):
        _fit(relic, _shapes(views=_relic_views()), tmp_path)
    relic = ReLICModule(num_classes=4, task="ordinal", mini_batch_size=4, **RELIC_ARGS, **SMALL)
    with pytest.raises(ValueError, match="last training batch holds 2 images.*drop_last: true"):
        _fit(relic, _shapes(views=_relic_views(), train_size=34, drop_last=False), tmp_path)
    with pytest.raises(ValueError, match="mini_batch_size must be a positive integer"):
        ReLICModule(mini_batch_size=0)
