"""OrdinalCLIP fidelity to the seed repo xk-huang/OrdinalCLIP (issue 14).

1. QuickGELU: weights trained with QuickGELU (every ``openai`` tag) are built on the
   ``-quickgelu`` architecture (open_clip only warns and runs them with ``nn.GELU``).
2. ``configs/ordinal_clip/utkface_seed.yaml`` holds the seed's settings, and the schedules /
   optimiser it selects behave as the seed's (``torch.optim.lr_scheduler`` stepped per epoch,
   the seed's RAdam weight decay).
3. ``normal`` interpolation: the seed's formula (re-implemented here) gives NaN rows for many
   (R, B); ours is finite and equal wherever the seed's is finite.

Everything runs offline: architectures are built with ``pretrained=None`` or from a fake cached
tag of a tiny registered config.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import yaml
from torch import nn

open_clip = pytest.importorskip("open_clip")
from open_clip.transformer import QuickGELU  # noqa: E402

from cloc_lightning.data import UTKFaceDataModule  # noqa: E402
from cloc_lightning.methods import OrdinalCLIPModule  # noqa: E402
from cloc_lightning.methods.optim import lr_factor  # noqa: E402
from cloc_lightning.nn import clip as clip_mod  # noqa: E402
from cloc_lightning.nn.clip import load_clip  # noqa: E402
from cloc_lightning.nn.prompt_learner import RankPromptLearner, rank_interpolation_weights  # noqa: E402
from tests.conftest import REPO, linked_model_args, run_cli  # noqa: E402
from tests.references.ordinal_clip import seed_interpolation  # noqa: E402
from tests.references.schedules import torch_epoch_lrs  # noqa: E402

SEED_CFG = REPO / "configs" / "ordinal_clip" / "utkface_seed.yaml"

# a tiny architecture registered under a plain and a -quickgelu name, with a fake tag trained
# with QuickGELU (registered for both names, as open_clip registers "openai")
IMG = 16
TINY = {
    "embed_dim": 24,
    "vision_cfg": {"layers": 1, "width": 32, "head_width": 16, "patch_size": 8, "image_size": IMG},
    "text_cfg": {"context_length": 24, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 2},
}
PLAIN, QG, TAG = "cloc-fid-tiny", "cloc-fid-tiny-quickgelu", "fakeqg"
HUB_REPO = "cloc-test/fid-fake"


def activations(module: nn.Module) -> set[type]:
    """Types of the MLP activations of open_clip residual blocks under ``module``."""
    return {type(m.mlp.gelu) for m in module.modules() if hasattr(m, "mlp") and hasattr(m.mlp, "gelu")}


# --------------------------------------------------------------------------------------------
# 1. QuickGELU
# --------------------------------------------------------------------------------------------


def test_resolver_follows_open_clip_registry() -> None:
    """Every registered (model, tag) resolves to a model config with the tag's quick_gelu."""
    resolve = clip_mod.resolve_clip_model
    switched = 0
    for name, tag in open_clip.list_pretrained():
        want = bool(open_clip.get_pretrained_cfg(name, tag).get("quick_gelu", False))
        try:
            got, note = resolve(name, tag)
        except ValueError as exc:  # no variant with the tag's activation: refused, never silently wrong
            assert "wrong activation" in str(exc) and f"quick_gelu={want}" in str(exc)
            continue
        assert bool(open_clip.get_model_config(got).get("quick_gelu", False)) == want, (name, tag, got)
        assert open_clip.get_pretrained_cfg(got, tag), (name, tag, got)  # the tag exists for the variant
        assert (note is None) == (got == name)
        switched += got != name
    assert switched >= 10  # RN50, ViT-B-16, ViT-B-32, ViT-L-14 ... with openai
    assert resolve("ViT-B-16", "openai")[0] == "ViT-B-16-quickgelu"
    assert resolve("ViT-B/16", "openai")[0] == "ViT-B-16-quickgelu"
    assert resolve("RN50", "openai")[0] == "RN50-quickgelu"
    assert resolve("ViT-B-32", "openai")[0] == "ViT-B-32-quickgelu"
    assert resolve("ViT-B-16-quickgelu", "openai") == ("ViT-B-16-quickgelu", None)
    assert resolve("ViT-B-32", "laion2b_s34b_b79k") == ("ViT-B-32", None)  # GELU weights on a GELU model
    assert resolve("ViT-B-16", None) == ("ViT-B-16", None)
    assert resolve("ViT-B-16", "/some/checkpoint.pt") == ("ViT-B-16", None)  # a path: nothing to go by
    note = resolve("ViT-B-16", "openai")[1]
    assert "QuickGELU" in note and "clip_model: ViT-B-16-quickgelu" in note


def test_resolved_vit_b16_openai_architecture_uses_quickgelu() -> None:
    """The architecture picked for ViT-B-16 + openai has QuickGELU in both towers (random init)."""
    name, _ = clip_mod.resolve_clip_model("ViT-B-16", "openai")
    model = open_clip.create_model(name, pretrained=None)
    assert activations(model.transformer) == {QuickGELU}
    assert activations(model.visual) == {QuickGELU}
    plain = open_clip.create_model("ViT-B-16", pretrained=None)  # what open_clip builds for the plain name
    assert activations(plain.transformer) == {nn.GELU}


@pytest.fixture
def qg_registered(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Register PLAIN / QG tiny configs and a cached fake tag TAG (quick_gelu=True); return the hub cache."""
    import huggingface_hub.constants as hfc
    import open_clip.factory as factory
    import open_clip.pretrained as ocp

    monkeypatch.setitem(factory._MODEL_CONFIGS, PLAIN, dict(TINY))
    monkeypatch.setitem(factory._MODEL_CONFIGS, QG, dict(TINY, quick_gelu=True))
    tag_cfg = {"hf_hub": HUB_REPO + "/", "quick_gelu": True}
    monkeypatch.setitem(ocp._PRETRAINED, PLAIN, {TAG: tag_cfg})
    monkeypatch.setitem(ocp._PRETRAINED, QG, {TAG: tag_cfg})

    def no_download(*a, **k):
        raise AssertionError("nothing may be downloaded")

    monkeypatch.setattr(ocp, "hf_hub_download", no_download)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub = tmp_path / "hub"
    monkeypatch.setattr(hfc, "HF_HUB_CACHE", str(hub))
    torch.manual_seed(0)
    weights = open_clip.create_model(QG, pretrained=None).state_dict()
    folder = hub / ("models--" + HUB_REPO.replace("/", "--"))
    snap = folder / "snapshots" / ("0" * 40)
    snap.mkdir(parents=True)
    torch.save(weights, snap / "open_clip_pytorch_model.bin")
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text("0" * 40)
    return hub


def test_load_clip_builds_quickgelu_for_quickgelu_tag(qg_registered: Path, capsys: pytest.CaptureFixture) -> None:
    """PLAIN + a QuickGELU tag: the weights are loaded into the QuickGELU architecture, with a note."""
    model, _ = load_clip(PLAIN, TAG, cache_dir=str(qg_registered))
    assert activations(model.transformer) == {QuickGELU} and activations(model.visual) == {QuickGELU}
    out = capsys.readouterr().out
    assert f"built as '{QG}'" in out
    cached = torch.load(next(qg_registered.rglob("*.bin")), weights_only=True)
    for k, v in model.state_dict().items():
        assert torch.equal(v, cached[k]), k
    # already the right name: no note
    model2, _ = load_clip(QG, TAG, cache_dir=str(qg_registered))
    assert activations(model2.transformer) == {QuickGELU} and "built as" not in capsys.readouterr().out


def test_module_records_the_resolved_architecture(qg_registered: Path) -> None:
    """OrdinalCLIPModule(PLAIN, TAG): QuickGELU text and image towers; hparams (checkpoint) name QG."""
    torch.manual_seed(0)
    m = OrdinalCLIPModule(num_classes=5, clip_model=PLAIN, pretrained=TAG, num_context_tokens=4)
    assert m.hparams.clip_model == QG
    assert activations(m.head.prompt_learner.text_encoder) == {QuickGELU}
    assert activations(m.backbone) == {QuickGELU}
    assert m.encoder_builder()["kwargs"]["quick_gelu"] is True  # the exported visual tower too
    # what export-prototypes does: rebuild from the checkpoint's hparams with pretrained=None
    hp = {k: v for k, v in m.hparams.items() if not k.startswith("_")}
    rebuilt = OrdinalCLIPModule(**{**hp, "pretrained": None})
    assert activations(rebuilt.head.prompt_learner.text_encoder) == {QuickGELU}
    rebuilt.load_state_dict(m.state_dict())
    x = torch.randn(2, 3, IMG, IMG)
    m.eval(), rebuilt.eval()
    with torch.no_grad():
        torch.testing.assert_close(rebuilt(x), m(x))


def test_unresolvable_activation_mismatch_is_an_error(qg_registered: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import open_clip.pretrained as ocp

    # a GELU-trained tag registered only for the QuickGELU name: no plain variant holds it
    monkeypatch.setitem(ocp._PRETRAINED, QG, {"gelutag": {"hf_hub": HUB_REPO + "/"}})
    with pytest.raises(ValueError, match="wrong activation"):
        load_clip(QG, "gelutag", cache_dir=str(qg_registered))


# --------------------------------------------------------------------------------------------
# 2. the seed config
# --------------------------------------------------------------------------------------------


def _seed_cfg() -> dict:
    return yaml.safe_load(SEED_CFG.read_text())


@pytest.mark.slow  # a CLI subprocess run: the long tier (pytest -m slow)
def test_seed_config_prints() -> None:
    proc = run_cli(["fit", "--config", str(SEED_CFG), "--print_config"], cwd=REPO, timeout=300)
    cfg = yaml.safe_load(proc.stdout)
    args = cfg["model"]["init_args"]
    assert args["clip_model"] == "RN50-quickgelu" and args["pretrained"] == "openai"
    assert args["weight_decay"] == 0.0005 and args["lr"] == 0.0001 and args["optimizer"] == "radam"
    assert cfg["trainer"]["precision"] == "16-mixed" and cfg["trainer"]["max_epochs"] == 100


def test_seed_config_values() -> None:
    cfg = _seed_cfg()
    t, m, d = cfg["trainer"], cfg["model"]["init_args"], cfg["data"]["init_args"]
    assert cfg["seed_everything"] == 114514
    assert t["max_epochs"] == 100 and t["precision"] == "16-mixed" and t["devices"] == 1
    # MORPH: num_ranks 101; the model's num_classes is the data module's (linked by the command line, named once)
    assert "num_classes" not in m
    assert UTKFaceDataModule(**d).num_classes == d["max_age"] - d["min_age"] + 1 == 101
    prompt = (m["num_base_ranks"], m["num_tokens_per_rank"], m["interpolation"], m["rank_position"])
    assert prompt == (3, 1, "linear", "tail")
    assert m["init_context"] == "age estimation: the age of the person is" and m["rank_specific_context"] is False
    assert math.exp(m["logit_scale"]) == pytest.approx(100.0) and m["learn_logit_scale"] is False
    assert (m["ce_weight"], m["kl_weight"], m["target_sharpness"]) == (1.0, 1.0, 10.0)
    assert (m["scheduler"], m["lr_interval"], m["warmup_epochs"], m["min_lr_ratio"]) == ("cosine", "step", 0, 0.0)
    assert m["image_encoder"] == "clip" and m["head"] == "prompts"
    assert (d["image_size"], d["batch_size"], d["eval_batch_size"]) == (224, 32, 32)
    assert d["mean"] == [0.485, 0.456, 0.406] and d["std"] == [0.229, 0.224, 0.225]  # the seed's ImageNet stats
    assert d["augment"] == "crop_flip" and d["drop_last"] is False


def test_seed_config_builds_module_with_seed_settings() -> None:
    """The config's model arguments, with pretrained=None (no weights here), on the real RN50 architecture."""
    args = dict(linked_model_args(_seed_cfg()), pretrained=None)  # num_classes: the data module's 101 ages, as the CLI links it
    torch.manual_seed(0)
    m = OrdinalCLIPModule(**args)
    pl = m.head.prompt_learner
    assert m.hparams.clip_model == "RN50-quickgelu" and activations(pl.text_encoder) == {QuickGELU}
    assert pl.context_length == 77 and pl.num_context_tokens == 10 and pl.num_base_ranks == 3
    assert pl.num_tokens_per_rank == 1 and pl.rank_position == "tail" and pl.interpolation == "linear"
    assert pl.eot_index == 1 + 10 + 1 + 1
    assert m.head.logit_scale.exp().item() == pytest.approx(100.0) and not m.head.logit_scale.requires_grad
    assert all(not p.requires_grad for p in pl.text_encoder.parameters())  # frozen text encoder
    groups = {g["name"]: g for g in m.param_groups()}
    assert set(groups) == {"image_encoder", "context", "ranks"}
    assert all(g["lr"] == 1e-4 for g in groups.values())
    opt = m.build_optimizer([g for g in m.param_groups() if g["params"]])
    assert isinstance(opt, torch.optim.RAdam)
    assert opt.defaults["decoupled_weight_decay"] is True and opt.defaults["weight_decay"] == 5e-4
    assert opt.defaults["betas"] == (0.9, 0.999)


def test_radam_weight_decay_is_decoupled_as_the_seed() -> None:
    """Seed RAdam: p <- p - lr*wd*p.  With a zero gradient the adaptive part is 0, so only decay acts."""
    p = nn.Parameter(torch.ones(3))
    m = OrdinalCLIPModule(
        num_classes=4, clip_model="ViT-S-32-alt", clip_config=TINY, num_context_tokens=2, optimizer="radam", lr=0.1, weight_decay=0.5
    )
    opt = m.build_optimizer([{"params": [p]}])
    for _ in range(10):
        p.grad = torch.zeros(3)
        opt.step()
    # decoupled: (1 - lr*wd)^10 = 0.95^10; L2 (torch's default) would move p by ~lr per step instead
    torch.testing.assert_close(p.detach(), torch.full((3,), 0.95**10))


def test_seed_schedules_vs_ours() -> None:
    E, spe = 100, 7
    total = E * spe
    seed_cos = torch_epoch_lrs("cosine", E)
    for k in range(E):
        assert seed_cos[k] == pytest.approx(0.5 * (1 + math.cos(math.pi * k / E)), abs=1e-12)
        # ours, as the seed config sets it (cosine, lr_interval step, no warm-up, min 0):
        # equal at each epoch start, at most pi/(2E) below within the epoch
        assert lr_factor(k * spe, total, spe, "cosine", 0.0, 0.0, interval="step") == pytest.approx(seed_cos[k])
        for s in range(k * spe, (k + 1) * spe):
            ours = lr_factor(s, total, spe, "cosine", 0.0, 0.0, interval="step")
            assert seed_cos[k] - math.pi / (2 * E) - 1e-12 <= ours <= seed_cos[k] + 1e-12
        # lr_interval: epoch is the seed's schedule one epoch ahead
        ours_epoch = lr_factor(k * spe, total, spe, "cosine", 0.0, 0.0, interval="epoch", max_epochs=E)
        assert ours_epoch == pytest.approx(0.5 * (1 + math.cos(math.pi * (k + 1) / E)))
    # the seed's default.yaml: MultiStepLR([60], 0.1) per epoch == ours (either interval), every step
    seed_step = torch_epoch_lrs("step", E)
    for s in range(total):
        for interval in ("step", "epoch"):
            ours = lr_factor(s, total, spe, "step", 0.0, 0.0, [60], 0.1, interval=interval, max_epochs=E)
            assert ours == pytest.approx(seed_step[s // spe]), (s, interval)


def test_linear_head_default_logit_scale_is_the_seed_baselines_100() -> None:
    """The seed's Baseline multiplies cosines by a fixed 100, whatever the CLIP model's scale."""
    m = OrdinalCLIPModule(num_classes=4, clip_model="ViT-S-32-alt", clip_config=TINY, head="linear")
    assert m.head.logit_scale.exp().item() == pytest.approx(100.0)
    m = OrdinalCLIPModule(num_classes=4, clip_model="ViT-S-32-alt", clip_config=TINY, num_context_tokens=2)
    assert m.head.logit_scale.item() == pytest.approx(math.log(1 / 0.07), rel=1e-5)  # prompts: CLIP's own


# --------------------------------------------------------------------------------------------
# 3. 'normal' interpolation: the seed's formula vs ours
# --------------------------------------------------------------------------------------------


GRID = [(R, B) for B in range(1, 8) for R in (B, 5, 10, 21, 22, 23, 43, 44, 63, 80, 100, 101, 128) if max(B, 2) <= R]


def test_seed_normal_interpolation_has_nan_rows_ours_is_finite_and_equal() -> None:
    nan_cases = {}
    tiny = torch.finfo(torch.float32).tiny
    for R, B in GRID:
        seed = seed_interpolation(R, B, "normal")
        ours = rank_interpolation_weights(R, B, "normal")
        assert torch.isfinite(ours).all() and (ours >= 0).all()
        torch.testing.assert_close(ours.double().sum(1), torch.ones(R, dtype=torch.float64), atol=1e-6, rtol=0)
        finite = torch.isfinite(seed).all(1)
        if not finite.all():
            nan_cases[(R, B)] = int((~finite).sum())
            # NaN rows: ours weights the nearest base most (the formula's limit: all weight on it)
            pos = torch.linspace(0, R - 1, B, dtype=torch.float64) if B > 1 else torch.tensor([(R - 1) / 2])
            rows = (~finite).nonzero().flatten()
            dist = (rows[:, None].double() - pos[None]).abs()
            nearest = dist <= dist.min(1, keepdim=True).values + 1e-9  # one base, or two at a tie
            assert nearest.gather(1, ours[rows].argmax(1, keepdim=True)).all()  # the largest weight is a nearest base's
        # where the seed's row sum is a normal float32: equal up to float32 rounding of its base positions
        raw = torch.exp(
            -(
                (
                    torch.arange(R, dtype=torch.float32)[:, None]
                    - (torch.linspace(0, R - 1, 3)[1:2] if B == 1 else torch.linspace(0, R - 1, B))[None]
                )
                ** 2
            )
        )
        normal = finite & (raw.sum(1) >= tiny)
        torch.testing.assert_close(ours[normal], seed[normal], atol=5e-5, rtol=0)
        # the same formula in float64 (finite for these sizes except the farthest rows): equal to 1e-12
        seed64 = seed_interpolation(R, B, "normal", torch.float64)
        ok64 = torch.isfinite(seed64).all(1)
        ours64 = rank_interpolation_weights(R, B, "normal", torch.float64)
        torch.testing.assert_close(ours64[ok64], seed64[ok64], atol=1e-12, rtol=0)
    # where the seed breaks (float32): B=1 from R=22, B=2 from R=23, B=3 from R=44 (R=80: 38 rows, R=101: 58)
    assert (21, 1) not in nan_cases and (22, 1) in nan_cases
    assert (22, 2) not in nan_cases and (23, 2) in nan_cases
    assert (43, 3) not in nan_cases and nan_cases[(44, 3)] >= 1
    assert nan_cases[(80, 3)] == 38 and nan_cases[(101, 3)] == 58


@pytest.mark.parametrize("kind", ["linear", "inv_prop"])
def test_linear_and_inv_prop_equal_the_seed(kind: str) -> None:
    for R, B in GRID:
        seed = seed_interpolation(R, B, kind)
        assert torch.isfinite(seed).all()
        torch.testing.assert_close(rank_interpolation_weights(R, B, kind), seed, atol=2e-6, rtol=0)


def test_normal_interpolation_prompts_finite_where_the_seed_would_be_nan() -> None:
    """R = 80, B = 3 (UTKFace ages): the seed's rank embeddings would be NaN for 38 ranks."""
    torch.manual_seed(0)
    clip = open_clip.create_model("ViT-S-32-alt", pretrained=None, **TINY)
    pl = RankPromptLearner(clip, num_ranks=80, num_base_ranks=3, num_context_tokens=2, interpolation="normal")
    assert torch.isfinite(pl.rank_embeddings()).all()
    feats = pl()
    assert feats.shape == (80, 24) and torch.isfinite(feats).all()
    seed_ranks = torch.einsum("rb,btw->rtw", seed_interpolation(80, 3, "normal"), pl.base_rank_embeds.detach())
    assert int((~torch.isfinite(seed_ranks).all(-1).all(-1)).sum()) == 38
