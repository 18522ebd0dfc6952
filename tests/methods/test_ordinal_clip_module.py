"""OrdinalCLIPModule: frozen text encoder, optimiser groups, logits/loss wiring, prototype cache,
export equality, fit + CLI smoke, bad inputs.

A tiny CLIP (``clip_config``: width 32, 2 text layers, context 24, 16 px images) keeps every
test fast; the CLI tests run the real ``python -m cloc_lightning`` in a subprocess.
"""

from __future__ import annotations

import math
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

open_clip = pytest.importorskip("open_clip")

from cloc_lightning.data import OrdinalShapesDataModule  # noqa: E402
from cloc_lightning.hub import PretrainedUnavailableError  # noqa: E402
from cloc_lightning.losses.rank_prompt import ordinal_clip_loss  # noqa: E402
from cloc_lightning.methods import OrdinalCLIPModule  # noqa: E402
from cloc_lightning.nn.encoders import ProjectedEncoder  # noqa: E402
from cloc_lightning.nn.prototype_classifier import PrototypeClassifier  # noqa: E402
from cloc_lightning.nn.prototypes import MAX_LOGIT_SCALE, LinearPrototypeHead, RankPromptHead  # noqa: E402
from cloc_lightning.nn.text_encoder import FrozenTextEncoder  # noqa: E402
from tests.conftest import REPO, TINY_BACKBONE, cpu_trainer, linked_model_args, run_cli  # noqa: E402

IMG = 16
TINY = {
    "embed_dim": 24,
    "vision_cfg": {"layers": 1, "width": 32, "head_width": 16, "patch_size": 8, "image_size": IMG},
    "text_cfg": {"context_length": 24, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 2},
}
TINY_JSON = (
    '{"embed_dim": 24, "vision_cfg": {"layers": 1, "width": 32, "head_width": 16, "patch_size": 8, "image_size": 16}, '
    '"text_cfg": {"context_length": 24, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 2}}'
)


def make(num_classes: int = 5, seed: int = 0, **kw) -> OrdinalCLIPModule:
    torch.manual_seed(seed)
    args = dict(num_classes=num_classes, clip_model="ViT-S-32-alt", clip_config=TINY, num_context_tokens=4)
    args.update(kw)
    return OrdinalCLIPModule(**args)


def _dm(num_classes: int = 5) -> OrdinalShapesDataModule:
    return OrdinalShapesDataModule(
        num_classes=num_classes, train_size=40, val_size=20, test_size=20, batch_size=10, num_workers=0, image_size=IMG
    )


_trainer = partial(cpu_trainer, max_epochs=1, enable_checkpointing=False)


def text_params(m: OrdinalCLIPModule) -> dict[str, torch.Tensor]:
    return dict(m.head.prompt_learner.text_encoder.named_parameters())


# --------------------------------------------------------------------------------------------
# construction, optimiser groups
# --------------------------------------------------------------------------------------------


def test_parts_and_param_groups_with_their_lrs() -> None:
    m = make(lr=1e-3, context_lr=0.01, rank_lr=0.02, image_encoder_lr=0.003, scheduler="none")
    assert isinstance(m.head, RankPromptHead) and m.feature_dim == 24
    assert isinstance(m.head.prompt_learner.text_encoder, FrozenTextEncoder)
    assert m.head.logit_scale.requires_grad is False and "logit_scale" in dict(m.head.named_buffers())
    assert m.head.logit_scale.item() == pytest.approx(math.log(1 / 0.07), rel=1e-6)  # the CLIP model's
    groups = {g["name"]: g for g in m.param_groups()}
    assert set(groups) == {"image_encoder", "context", "ranks"}
    assert (groups["context"]["lr"], groups["ranks"]["lr"], groups["image_encoder"]["lr"]) == (0.01, 0.02, 0.003)
    assert groups["context"]["params"] == [m.head.prompt_learner.context_embeds]
    assert groups["ranks"]["params"] == [m.head.prompt_learner.base_rank_embeds]
    opt = m.configure_optimizers()
    assert isinstance(opt, torch.optim.RAdam)  # the reference's optimiser is the default
    in_opt = {id(p) for g in opt.param_groups for p in g["params"]}
    trainable = {id(p) for p in m.parameters() if p.requires_grad}
    assert in_opt == trainable  # every trainable parameter once, nothing else
    assert not in_opt & {id(p) for p in text_params(m).values()}
    assert all(not p.requires_grad for p in text_params(m).values()) and len(text_params(m)) > 10
    # defaults: every group at the base lr; a learned logit scale gets its own group without decay
    m2 = make(lr=5e-4, learn_logit_scale=True, logit_scale_lr=0.1, weight_decay=0.01, optimizer="adam")
    g2 = {g["name"]: g for g in m2.param_groups()}
    assert g2["context"]["lr"] == g2["ranks"]["lr"] == g2["image_encoder"]["lr"] == 5e-4
    assert g2["logit_scale"]["params"] == [m2.head.logit_scale] and g2["logit_scale"]["weight_decay"] == 0.0
    assert g2["logit_scale"]["lr"] == 0.1 and m2.head.logit_scale.requires_grad


def test_timm_encoder_and_linear_head() -> None:
    m = make(image_encoder="timm", backbone=TINY_BACKBONE, head="linear", rank_lr=0.05, logit_scale=math.log(100))
    assert isinstance(m.head, LinearPrototypeHead) and isinstance(m.image_proj, torch.nn.Linear)
    assert m.backbone(torch.randn(2, 3, 32, 32)).shape == (2, m.feature_dim)  # bare timm features, as CE's
    assert m.image_features(torch.randn(2, 3, 32, 32)).shape == (2, 24) and m.image_proj.out_features == 24
    assert isinstance(m.image_encoder_module(), ProjectedEncoder)
    assert any(k.startswith("backbone.conv1") for k in m.state_dict())  # same keys as CEModule's encoder
    assert not any("text_encoder" in k for k in m.state_dict())  # no text tower kept
    groups = {g["name"]: g for g in m.param_groups()}
    assert set(groups) == {"image_encoder", "prototypes"} and groups["prototypes"]["lr"] == 0.05
    assert groups["prototypes"]["params"] == [m.head.weight] and m.head.weight.shape == (5, 24)
    assert m.head.logit_scale.item() == pytest.approx(math.log(100))


# --------------------------------------------------------------------------------------------
# logits and loss against a NumPy reference
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("head", ["prompts", "linear"])
def test_logits_and_loss_match_reference(head: str) -> None:
    m = make(head=head, logit_scale=3.0).eval()  # eval: deterministic image encoder
    x, y = torch.randn(6, 3, IMG, IMG), torch.tensor([0, 1, 2, 3, 4, 2])
    with torch.no_grad():
        feats = m.image_features(x).double().numpy()
        protos = m.head.compute_prototypes().double().numpy()
    ref = (
        math.exp(3.0) * (feats / np.linalg.norm(feats, axis=1, keepdims=True)) @ (protos / np.linalg.norm(protos, axis=1, keepdims=True)).T
    )
    logits = m(x)
    assert logits.shape == (6, 5) and logits.dtype == torch.float32
    np.testing.assert_allclose(logits.detach().double().numpy(), ref, rtol=1e-5, atol=1e-5)
    loss = m.training_step((x, y), 0)
    expected, _ = ordinal_clip_loss(torch.from_numpy(ref), y)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5, abs=1e-6)
    # predictions read out both ways
    with torch.no_grad():
        out = m.predict_step((x, y), 0)
    p = torch.softmax(torch.from_numpy(ref), 1)
    np.testing.assert_allclose(out["expected"].double().numpy(), (p @ torch.arange(5.0).double()).numpy(), rtol=1e-5)
    assert torch.equal(out["pred"], torch.from_numpy(ref).argmax(1))


def test_bf16_autocast_logits_stay_float32_and_finite() -> None:
    m = make(logit_scale=math.log(100)).eval()
    x, y = torch.randn(6, 3, IMG, IMG), torch.tensor([0, 1, 2, 3, 4, 0])
    with torch.no_grad():
        ref = m(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = m(x)
        loss = m.criterion(logits, y)
    assert logits.dtype == torch.float32 and torch.isfinite(logits).all() and torch.isfinite(loss)
    assert torch.allclose(logits.detach(), ref, atol=100 * 0.05)  # bf16 towers, float32 similarities at scale 100


def test_learned_logit_scale_is_clamped_at_100() -> None:
    m = make(learn_logit_scale=True, logit_scale=6.0)
    assert m.head.effective_logit_scale().item() == pytest.approx(MAX_LOGIT_SCALE)
    x = torch.randn(3, 3, IMG, IMG)
    m.eval()
    with torch.no_grad():
        cos = F.normalize(m.image_features(x), dim=-1) @ m.prototypes().t()
        assert torch.allclose(m(x), 100.0 * cos, atol=1e-4)


# --------------------------------------------------------------------------------------------
# frozen text encoder through a real fit; prototype cache
# --------------------------------------------------------------------------------------------


def test_fit_keeps_text_encoder_frozen_and_out_of_the_optimiser(tmp_path: Path) -> None:
    m = make(lr=1e-2, context_lr=0.02, rank_lr=0.03, image_encoder_lr=0.004, warmup_epochs=0.5)
    before = {k: v.detach().clone() for k, v in text_params(m).items()}
    ctx0 = m.head.prompt_learner.context_embeds.detach().clone()
    ranks0 = m.head.prompt_learner.base_rank_embeds.detach().clone()
    trainer = _trainer(tmp_path, max_epochs=1, limit_val_batches=1)
    trainer.fit(m, datamodule=_dm())
    assert trainer.global_step == 4
    for k, p in text_params(m).items():
        assert p.grad is None and not p.requires_grad, k
        assert torch.equal(p.detach(), before[k]), k
    assert not m.head.prompt_learner.text_encoder.training  # stays in eval mode
    assert not torch.equal(m.head.prompt_learner.context_embeds.detach(), ctx0)  # learned
    assert not torch.equal(m.head.prompt_learner.base_rank_embeds.detach(), ranks0)
    opt = trainer.optimizers[0]
    in_opt = {id(p) for g in opt.param_groups for p in g["params"]}
    assert not in_opt & {id(p) for p in text_params(m).values()}
    lrs = {g["name"]: g["initial_lr"] for g in opt.param_groups}  # the configured lr of each group
    assert lrs == {"image_encoder": 0.004, "context": 0.02, "ranks": 0.03}
    metrics = trainer.validate(m, datamodule=_dm(), verbose=False)[0]
    assert {"val/mae", "val/mae_expected", "val/acc", "val/qwk", "val/acc_pm1"} <= set(metrics)


def test_clip_image_size_mismatch_is_a_clear_error(tmp_path: Path) -> None:
    """CLIP's visual tower has a fixed input size: a data module with another size fails at setup, by name."""
    dm = OrdinalShapesDataModule(num_classes=5, train_size=20, val_size=10, test_size=10, batch_size=10, num_workers=0, image_size=2 * IMG)
    with pytest.raises(ValueError, match=f"takes {IMG}x{IMG} px images .* image_size={2 * IMG}; set --data.image_size {IMG}"):
        _trainer(tmp_path, max_epochs=1).fit(make(), datamodule=dm)
    # a timm encoder takes any size
    _trainer(tmp_path, max_epochs=1, limit_val_batches=1).fit(make(image_encoder="timm", backbone=TINY_BACKBONE), datamodule=dm)


def test_prototype_cache_in_eval_recompute_in_training() -> None:
    m = make()
    calls = []
    m.head.prompt_learner.register_forward_hook(lambda *a: calls.append(1))
    x = torch.randn(4, 3, IMG, IMG)
    m.eval()
    with torch.no_grad():
        a = m(x)
        b = m(x)
    assert len(calls) == 1 and torch.equal(a, b)  # cached
    with torch.no_grad():  # an in-place update (an optimiser step, load_state_dict) invalidates it
        m.head.prompt_learner.context_embeds.add_(0.5)
        c = m(x)
    assert len(calls) == 2 and not torch.equal(a, c)
    m.head.prompt_learner.load_state_dict(m.head.prompt_learner.state_dict())
    with torch.no_grad():
        m(x)
    assert len(calls) == 3
    with torch.inference_mode():
        d = m(x)
        e = m(x)
    assert len(calls) == 4 and torch.equal(c, d) and torch.equal(d, e)
    # gradients enabled (even in eval mode) and training mode: recomputed every call, with gradient
    m(x).sum().backward()
    assert len(calls) == 5 and m.head.prompt_learner.context_embeds.grad is not None
    m.train()
    m(x)
    m(x)
    assert len(calls) == 7


# --------------------------------------------------------------------------------------------
# export
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("encoder,head", [("clip", "prompts"), ("timm", "prompts"), ("timm", "linear")])
def test_export_logits_equal_module_and_load_without_text_tower(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, encoder: str, head: str
) -> None:
    m = make(image_encoder=encoder, backbone=TINY_BACKBONE, head=head)
    with torch.no_grad():  # move the prompts away from their initialisation
        for p in m.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn_like(p))
    m.eval()
    x = torch.randn(5, 3, IMG, IMG) if encoder == "clip" else torch.randn(5, 3, 32, 32)
    path = tmp_path / "export.pt"
    clf = m.export_prototypes(path, rank_values=[10.0, 20.0, 30.0, 40.0, 50.0])
    # loading must not build a CLIP text tower (nor any full CLIP model)
    import open_clip.model as ocm

    def no_text(*a, **k):
        raise AssertionError("the export must load without a text tower")

    monkeypatch.setattr(ocm, "_build_text_tower", no_text)
    monkeypatch.setattr(ocm.CLIP, "__init__", no_text)
    loaded = PrototypeClassifier.load(path, allow_pickle=False)  # state dict + builder, no pickled code
    assert loaded.encoder_builder["name"] == ("open_clip_visual" if encoder == "clip" else "timm_projected")
    assert not any(isinstance(mod, FrozenTextEncoder) for mod in loaded.modules())
    n_loaded = sum(p.numel() for p in loaded.parameters())
    n_encoder = sum(p.numel() for mod in (m.backbone, m.image_proj) for p in mod.parameters())
    assert n_loaded == n_encoder  # the image encoder only; the prototypes are a buffer
    with torch.no_grad():
        ref = m(x)
        assert torch.equal(clf(x), ref)
        assert torch.equal(loaded(x), ref)
        values = torch.tensor([10.0, 20, 30, 40, 50])
        assert torch.allclose(loaded.predict(x), torch.softmax(ref, 1) @ values, atol=1e-4)
        assert torch.equal(loaded.predict(x, kind="argmax"), 10.0 * (ref.argmax(1) + 1).float())
    assert loaded.prototypes.shape == (5, 24)
    payload = torch.load(path, weights_only=True)
    assert not any("text" in k or "token_embedding" in k for k in payload["encoder_state_dict"])


# --------------------------------------------------------------------------------------------
# CLI: fit, then export-prototypes, in subprocesses
# --------------------------------------------------------------------------------------------


@pytest.mark.slow  # a CLI subprocess run: the long tier (pytest -m slow)
def test_cli_fit_and_export_prototypes(tmp_path: Path) -> None:
    out = run_cli(
        [
            "fit",
            "--model",
            "OrdinalCLIPModule",
            "--model.num_classes",
            "4",
            "--model.clip_model",
            "ViT-S-32-alt",
            "--model.clip_config",
            TINY_JSON,
            "--model.num_context_tokens",
            "4",
            "--model.lr",
            "0.01",
            "--data",
            "OrdinalShapesDataModule",
            "--data.num_classes",
            "4",
            "--data.image_size",
            str(IMG),
            "--data.train_size",
            "32",
            "--data.val_size",
            "16",
            "--data.test_size",
            "16",
            "--data.batch_size",
            "16",
            "--data.num_workers",
            "0",
            "--trainer.max_epochs",
            "1",
            "--trainer.enable_progress_bar",
            "false",
            "--trainer.enable_model_summary",
            "false",
            "--trainer.logger.init_args.save_dir",
            "runs",
            "--trainer.logger.init_args.name",
            "oc",
            "--test_after_fit",
            "true",
        ],
        tmp_path,
    ).stdout
    assert "test/mae_expected" in out
    ckpt = tmp_path / "runs" / "oc" / "version_0" / "checkpoints" / "last.ckpt"
    assert ckpt.is_file()
    export = tmp_path / "oc_export.pt"
    res = run_cli(["export-prototypes", str(ckpt), str(export), "--rank-offset", "1"], tmp_path)
    assert "exported 4 prototypes" in res.stdout and export.is_file()
    model = OrdinalCLIPModule.load_from_checkpoint(str(ckpt), map_location="cpu").eval()
    clf = PrototypeClassifier.load(export, allow_pickle=False)
    x = torch.randn(6, 3, IMG, IMG)
    with torch.no_grad():
        assert torch.equal(clf(x), model(x))
    assert torch.equal(clf.rank_values, torch.arange(1.0, 5.0))
    bad = run_cli(["export-prototypes", str(tmp_path / "missing.ckpt"), str(export)], tmp_path, check=False)
    assert bad.returncode != 0 and "does not exist" in bad.stderr


def test_shipped_configs_parse() -> None:
    import yaml

    for name in ("utkface", "utkface_linear"):
        cfg = yaml.safe_load((REPO / "configs" / "ordinal_clip" / f"{name}.yaml").read_text())
        args = cfg["model"]["init_args"]
        assert cfg["model"]["class_path"] == "cloc_lightning.methods.OrdinalCLIPModule"
        assert args["pretrained"] is None and args["head"] == ("prompts" if name == "utkface" else "linear")
        assert cfg["data"]["init_args"]["label_mode"] == "age"
        span = cfg["data"]["init_args"]["max_age"] - cfg["data"]["init_args"]["min_age"] + 1
        # the model's num_classes is the data module's (the command line links it; the config names it once)
        assert "num_classes" not in args
        # the config's module arguments are accepted (a tiny CLIP stands in for ViT-S-32-alt)
        kwargs = {k: v for k, v in linked_model_args(cfg).items() if k not in ("backbone",)}
        m = OrdinalCLIPModule(**{**kwargs, "clip_config": TINY, "backbone": TINY_BACKBONE})
        assert m.num_classes == span


# --------------------------------------------------------------------------------------------
# bad inputs
# --------------------------------------------------------------------------------------------


def test_bad_inputs() -> None:
    with pytest.raises(ValueError, match="num_classes must be an integer >= 2"):
        make(num_classes=1)
    with pytest.raises(ValueError, match="num_base_ranks"):
        make(num_classes=3, num_base_ranks=4)
    with pytest.raises(ValueError, match="interpolation must be"):
        make(interpolation="cubic")
    with pytest.raises(ValueError, match="rank_position must be"):
        make(rank_position="side")
    with pytest.raises(ValueError, match="image_encoder must be"):
        make(image_encoder="resnet")
    with pytest.raises(ValueError, match="head must be"):
        make(head="mlp")
    with pytest.raises(ValueError, match="context_lr must be a number >= 0"):
        make(context_lr=-1.0)
    with pytest.raises(ValueError, match="kl_weight"):
        make(kl_weight=-0.5)
    with pytest.raises(ValueError, match="Unknown open_clip model name 'ViT-B32'.*ViT-B-32"):
        OrdinalCLIPModule(num_classes=5, clip_model="ViT-B32")
    with pytest.raises(ValueError, match="Unknown timm backbone"):
        make(image_encoder="timm", backbone="resnet_nope")
    with pytest.raises(ValueError, match="pretrained: null or a checkpoint file path"):
        make(pretrained="openai")
    with pytest.raises(TypeError, match="clip_config must be a dict"):
        make(clip_config="tiny")
    m = make()
    with pytest.raises(ValueError, match="labels must be ranks in"):
        m.training_step((torch.randn(2, 3, IMG, IMG), torch.tensor([0, 5])), 0)
    with pytest.raises(ValueError, match="single-view"):
        m.training_step(([torch.randn(2, 3, IMG, IMG)] * 2, torch.tensor([0, 1])), 0)


def test_pretrained_unavailable_offline_fails_fast(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import huggingface_hub.constants as hfc
    import open_clip.pretrained as ocp

    def no_download(*a, **k):
        raise AssertionError("no download may be attempted offline")

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hfc, "HF_HUB_CACHE", str(tmp_path / "empty_hub"))  # nothing cached
    monkeypatch.setattr(ocp, "hf_hub_download", no_download)
    monkeypatch.setattr(ocp, "download_pretrained_from_url", no_download)
    built = []
    monkeypatch.setattr(open_clip, "create_model", lambda *a, **k: built.append(1))
    with pytest.raises(PretrainedUnavailableError, match="pretrained: null") as info:
        OrdinalCLIPModule(num_classes=5, clip_model="RN50-quickgelu", pretrained="openai")
    assert "HF_HUB_OFFLINE" in str(info.value) and not built  # failed before building any model
    with pytest.raises(ValueError, match="neither a known open_clip tag"):
        OrdinalCLIPModule(num_classes=5, clip_model="RN50", pretrained=str(tmp_path / "missing.pt"))
