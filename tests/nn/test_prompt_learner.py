"""OrdinalCLIP building blocks: interpolation weights, rank prompt learner, CE+KL loss,
prototype classifier export and offline-safe CLIP loading.

All models are tiny open_clip CLIPs built in-process (width 32, 2 text layers, context 24),
so the file runs in a few seconds after ``import open_clip``.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch
from torch import nn

open_clip = pytest.importorskip("open_clip")
from open_clip.model import CLIPTextCfg, CLIPVisionCfg  # noqa: E402

from benchmarks.reference.ordinal_clip import interpolation_weights_formula, ordinal_clip_loss_reference  # noqa: E402
from cloc_lightning.losses.rank_prompt import OrdinalCLIPLoss, ordinal_clip_loss  # noqa: E402
from cloc_lightning.nn import hub  # noqa: E402
from cloc_lightning.nn.clip import load_clip  # noqa: E402
from cloc_lightning.nn.hub import PretrainedUnavailableError  # noqa: E402
from cloc_lightning.nn.prompt_learner import RankPromptLearner, rank_interpolation_weights  # noqa: E402
from cloc_lightning.nn.prototypes import PrototypeClassifier, logits_to_predictions  # noqa: E402

CTX_LEN = 24
VISION = dict(layers=1, width=32, head_width=16, patch_size=8, image_size=16)
TEXT = dict(context_length=CTX_LEN, vocab_size=49408, width=32, heads=2, layers=2)
TINY_CFG = {"embed_dim": 24, "vision_cfg": VISION, "text_cfg": TEXT}


def make_clip(kind: str = "clip", seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    if kind == "clip":
        model = open_clip.CLIP(embed_dim=24, vision_cfg=CLIPVisionCfg(**VISION), text_cfg=CLIPTextCfg(**TEXT))
    elif kind == "linear_proj":  # text_projection is an nn.Linear with bias
        model = open_clip.CLIP(
            embed_dim=24, vision_cfg=CLIPVisionCfg(**VISION), text_cfg=CLIPTextCfg(**TEXT, proj_bias=True)
        )
    elif kind == "custom_text":  # text tower under model.text
        model = open_clip.CustomTextCLIP(embed_dim=24, vision_cfg=CLIPVisionCfg(**VISION), text_cfg=CLIPTextCfg(**TEXT))
    else:
        raise AssertionError(kind)
    with torch.no_grad():  # non-trivial LayerNorm affine params so ln_final placement matters
        for name, p in model.named_parameters():
            if "ln" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model.eval()


@pytest.fixture(scope="module")
def tok():
    return open_clip.tokenizer.SimpleTokenizer(context_length=CTX_LEN)


@pytest.fixture(scope="module")
def tiny_clip():
    return make_clip("clip")


def token_table(model: nn.Module) -> torch.Tensor:
    src = model.text if hasattr(model, "text") else model
    return src.token_embedding.weight.detach()


# --------------------------------------------------------------------------------------------
# interpolation weights
# --------------------------------------------------------------------------------------------


_GRID = [(2, 1), (2, 2), (5, 1), (5, 2), (7, 3), (6, 6), (10, 10), (100, 3), (100, 1)]


# (100, 1, normal): exp(-d^2) underflows to 0/0 in the plain formula -> see the underflow test below
@pytest.mark.parametrize(
    "kind,R,B",
    [(k, R, B) for k in ("linear", "inv_prop", "normal") for R, B in _GRID if (k, R, B) != ("normal", 100, 1)],
)
def test_interpolation_weights_match_formula(kind, R, B):
    w = rank_interpolation_weights(R, B, kind)
    assert w.shape == (R, B) and w.dtype == torch.float32
    np.testing.assert_allclose(w.double().numpy(), interpolation_weights_formula(R, B, kind), rtol=1e-6, atol=1e-7)
    assert torch.all(w >= 0)
    np.testing.assert_allclose(w.double().sum(1).numpy(), np.ones(R), rtol=0, atol=1e-6)
    if B == 1:
        assert torch.all(w == 1)
    if kind == "inv_prop" and B == R:  # base r sits on rank r -> almost one-hot
        assert torch.all(w.diagonal() > 0.999)


def test_interpolation_normal_far_ranks_do_not_underflow():
    # B = 2, R = 100: rank 49 is 49 / 50 away from the bases, exp(-d^2) underflows even in float64
    w = rank_interpolation_weights(100, 2, "normal", dtype=torch.float64)
    assert torch.isfinite(w).all()
    d = np.abs(np.arange(100)[:, None] - np.array([0.0, 99.0])[None])
    logits = -(d**2)
    ref = np.exp(logits - logits.max(1, keepdims=True))
    ref /= ref.sum(1, keepdims=True)
    np.testing.assert_allclose(w.numpy(), ref, rtol=1e-12, atol=1e-300)
    assert w[49, 0] > 1 - 1e-12  # nearest base wins, where the plain formula gives 0/0
    # B = 1: the single base gets weight 1 however far (plain formula: 0/0 for R = 100)
    assert torch.equal(rank_interpolation_weights(100, 1, "normal"), torch.ones(100, 1))


@pytest.mark.parametrize(
    "args,err",
    [
        ((1, 1, "linear"), ValueError),
        ((0, 1, "linear"), ValueError),
        ((5, 6, "linear"), ValueError),
        ((5, 0, "linear"), ValueError),
        ((5, 2, "cubic"), ValueError),
        ((5.0, 2, "linear"), TypeError),
        ((5, True, "linear"), TypeError),
    ],
)
def test_interpolation_bad_inputs(args, err):
    with pytest.raises(err):
        rank_interpolation_weights(*args)


# --------------------------------------------------------------------------------------------
# prompt learner
# --------------------------------------------------------------------------------------------


def test_text_encoder_frozen_and_not_trainable(tiny_clip, tok):
    pl = RankPromptLearner(tiny_clip, num_ranks=6, num_base_ranks=3, num_context_tokens=4, tokenizer=tok)
    trainable = {id(p) for p in pl.trainable_parameters()}
    groups = pl.param_groups()
    assert set(groups) == {"context", "ranks"}
    assert trainable == {id(pl.context_embeds), id(pl.base_rank_embeds)}
    assert {id(p) for g in groups.values() for p in g} == trainable
    text_params = list(pl.text_encoder.parameters())
    assert len(text_params) > 0 and all(not p.requires_grad for p in text_params)
    assert not trainable & {id(p) for p in text_params}

    pl.train()
    assert pl.training and not pl.text_encoder.training
    assert all(not m.training for m in pl.text_encoder.modules())
    before = {n: p.detach().clone() for n, p in pl.text_encoder.named_parameters()}
    opt = torch.optim.SGD([{"params": groups["context"], "lr": 0.5}, {"params": groups["ranks"], "lr": 0.5}])
    feats = pl()
    (feats**2).sum().backward()
    assert all(p.grad is None for p in text_params)
    assert pl.context_embeds.grad is not None and pl.context_embeds.grad.abs().sum() > 0
    assert pl.base_rank_embeds.grad is not None and pl.base_rank_embeds.grad.abs().sum() > 0
    ctx0 = pl.context_embeds.detach().clone()
    opt.step()
    assert not torch.equal(ctx0, pl.context_embeds.detach())
    for n, p in pl.text_encoder.named_parameters():
        assert torch.equal(before[n], p.detach()), n


def expected_prompt(pl: RankPromptLearner, table: torch.Tensor, tok, length: int) -> torch.Tensor:
    """The prompt built by hand from the learner's parameters and the CLIP token table."""
    R, N, T = pl.num_ranks, pl.num_context_tokens, pl.num_tokens_per_rank
    w = torch.tensor(interpolation_weights_formula(R, pl.num_base_ranks, pl.interpolation), dtype=torch.float64)
    base = pl.base_rank_embeds.detach().double()
    period = tok.encode(".")[0]
    rows = []
    for r in range(R):
        ctx = pl.context_embeds.detach().double()
        ctx = ctx[r] if ctx.dim() == 3 else ctx
        rank = sum(w[r, b] * base[b] for b in range(pl.num_base_ranks))  # [T, W]
        if pl.rank_position == "tail":
            body = [ctx[i] for i in range(N)] + [rank[t] for t in range(T)]
        elif pl.rank_position == "front":
            body = [rank[t] for t in range(T)] + [ctx[i] for i in range(N)]
        else:
            body = [ctx[i] for i in range(N // 2)] + [rank[t] for t in range(T)] + [ctx[i] for i in range(N // 2, N)]
        seq = [table[tok.sot_token_id].double(), *body, table[period].double(), table[tok.eot_token_id].double()]
        seq += [table[0].double()] * (length - len(seq))
        rows.append(torch.stack(seq))
    return torch.stack(rows)


@pytest.mark.parametrize("position", ["tail", "front", "middle"])
@pytest.mark.parametrize("rank_specific", [False, True])
@pytest.mark.parametrize("kind", ["linear", "normal"])
def test_prompt_assembly_positions(tiny_clip, tok, position, rank_specific, kind):
    R, B, N, T = 5, 2, 5, 2
    pl = RankPromptLearner(
        tiny_clip, num_ranks=R, num_base_ranks=B, num_tokens_per_rank=T, num_context_tokens=N,
        rank_specific_context=rank_specific, interpolation=kind, rank_position=position, tokenizer=tok,
    )
    assert pl.context_embeds.shape == ((R, N, 32) if rank_specific else (N, 32))
    assert pl.base_rank_embeds.shape == (B, T, 32)
    assert pl.eot_index == 1 + N + T + 1
    table = token_table(tiny_clip)
    got = pl.prompt_embeddings()
    assert got.shape == (R, CTX_LEN, 32)
    torch.testing.assert_close(got.double(), expected_prompt(pl, table, tok, CTX_LEN), rtol=1e-6, atol=1e-7)
    # interpolation buffer = formula
    np.testing.assert_allclose(pl.interpolation_weights.double().numpy(), interpolation_weights_formula(R, B, kind), rtol=1e-6)

    # what the transformer receives: prompt + positional embedding, truncated after the EOT
    seen = {}
    hook = pl.text_encoder.transformer.register_forward_pre_hook(lambda m, a, kw: seen.update(x=a[0]), with_kwargs=True)
    try:
        pl()
    finally:
        hook.remove()
    L = pl.eot_index + 1
    want = expected_prompt(pl, table, tok, L) + tiny_clip.positional_embedding.detach()[:L].double()
    torch.testing.assert_close(seen["x"].double(), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kind", ["clip", "linear_proj", "custom_text"])
@pytest.mark.parametrize("position", ["tail", "front", "middle"])
@pytest.mark.parametrize("truncate", [True, False])
def test_features_equal_open_clip_encode_text(tok, kind, position, truncate):
    """Prompts set to the token embeddings of real sentences give open_clip's encode_text features."""
    model = make_clip(kind, seed=1)
    names = ["young", "adult", "old"]
    context = "the age of the person is"
    pl = RankPromptLearner(
        model, num_ranks=3, num_base_ranks=3, init_context=context, init_rank_names=names,
        rank_position=position, tokenizer=tok, truncate_padding=truncate,
    )
    with torch.no_grad():
        pl.interpolation_weights.copy_(torch.eye(3))  # rank r = base r exactly
    ctx_ids, rank_ids = tok.encode(context), [tok.encode(n) for n in names]
    assert all(len(r) == 1 for r in rank_ids)
    period = tok.encode(".")
    ids = []
    for r in range(3):
        half = len(ctx_ids) // 2
        body = {
            "tail": ctx_ids + rank_ids[r],
            "front": rank_ids[r] + ctx_ids,
            "middle": ctx_ids[:half] + rank_ids[r] + ctx_ids[half:],
        }[position]
        seq = [tok.sot_token_id, *body, *period, tok.eot_token_id]
        ids.append(seq + [0] * (CTX_LEN - len(seq)))
    ids = torch.tensor(ids)
    if position == "tail":  # the hand-built ids are what the tokenizer makes of the sentence
        torch.testing.assert_close(ids, tok([f"{context} {n}." for n in names]))
    ref = model.encode_text(ids)
    got = pl()
    assert got.shape == (3, 24)
    if truncate:
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    else:
        torch.testing.assert_close(got, ref, rtol=0, atol=0)


def test_rank_specific_context_matches_encode_text(tiny_clip, tok):
    sentences = ["a photo of", "the age is", "this person is"]
    pl = RankPromptLearner(
        tiny_clip, num_ranks=3, num_base_ranks=1, num_context_tokens=3, rank_specific_context=True,
        init_rank_names=["old"], tokenizer=tok,
    )
    assert torch.all(pl.interpolation_weights == 1)  # B = 1: every rank is the single base
    table = token_table(tiny_clip)
    ctx_len = [len(tok.encode(s)) for s in sentences]
    assert len(set(ctx_len)) == 1 and ctx_len[0] == 3
    with torch.no_grad():
        for r, s in enumerate(sentences):
            pl.context_embeds[r] = table[tok.encode(s)]
    ref = tiny_clip.encode_text(tok([f"{s} old." for s in sentences]))
    torch.testing.assert_close(pl(), ref, rtol=1e-5, atol=1e-5)


def test_init_names_and_context(tiny_clip, tok):
    table = token_table(tiny_clip)
    names = [f"age {i}" for i in range(10)]  # R names -> B picked at round(linspace(0, 9, 3)) = 0, 4(4.5->4), 9
    pl = RankPromptLearner(tiny_clip, num_ranks=10, num_base_ranks=3, init_rank_names=names,
                           init_context="age estimation:", num_context_tokens=7, tokenizer=tok)
    picked = [names[round(p)] for p in np.linspace(0, 9, 3)]
    T = max(len(tok.encode(n)) for n in picked)
    assert pl.num_tokens_per_rank == T
    for b, n in enumerate(picked):
        ids = tok.encode(n)
        ids = ids + [0] * (T - len(ids))
        torch.testing.assert_close(pl.base_rank_embeds.detach()[b], table[ids])
    ctx_ids = tok.encode("age estimation:")
    assert pl.num_context_tokens == len(ctx_ids) != 7
    torch.testing.assert_close(pl.context_embeds.detach(), table[ctx_ids])
    # B names used as they are; B = 1 with R names picks the middle rank
    pl_b = RankPromptLearner(tiny_clip, num_ranks=10, num_base_ranks=2, init_rank_names=["child", "elder"],
                             tokenizer=tok)
    want = table[[tok.encode("child")[0], tok.encode("elder")[0]]]
    torch.testing.assert_close(pl_b.base_rank_embeds.detach()[:, 0], want)
    pl_1 = RankPromptLearner(tiny_clip, num_ranks=5, num_base_ranks=1, init_rank_names=list("abcde"), tokenizer=tok)
    torch.testing.assert_close(pl_1.base_rank_embeds.detach()[0, 0], table[tok.encode("c")[0]])


def test_state_dict_can_exclude_text_encoder(tok):
    a = make_clip(seed=3)
    pl = RankPromptLearner(a, num_ranks=4, num_base_ranks=2, num_context_tokens=3, tokenizer=tok,
                           save_text_encoder=False)
    parent = nn.ModuleDict({"prompt": pl, "head": nn.Linear(2, 2)})
    sd = parent.state_dict()
    assert "prompt.context_embeds" in sd and "head.weight" in sd
    assert not [k for k in sd if "text_encoder" in k]
    # a fresh learner on an identical CLIP loads it strictly and gives identical features
    pl2 = RankPromptLearner(make_clip(seed=3), num_ranks=4, num_base_ranks=2, num_context_tokens=3, tokenizer=tok,
                            save_text_encoder=False)
    parent2 = nn.ModuleDict({"prompt": pl2, "head": nn.Linear(2, 2)})
    parent2.load_state_dict(sd, strict=True)
    torch.testing.assert_close(pl2(), pl(), rtol=0, atol=0)
    # a missing key of another module is still reported
    bad = {k: v for k, v in sd.items() if k != "head.weight"}
    with pytest.raises(RuntimeError, match="head.weight"):
        parent2.load_state_dict(bad, strict=True)
    # default keeps the text encoder (self-contained checkpoints, e.g. random-init CLIP)
    pl3 = RankPromptLearner(a, num_ranks=4, num_base_ranks=2, num_context_tokens=3, tokenizer=tok)
    assert any(k.startswith("text_encoder.transformer.") for k in pl3.state_dict())


@pytest.mark.parametrize(
    "kwargs,err,match",
    [
        (dict(num_ranks=1, num_base_ranks=1), ValueError, "num_ranks"),
        (dict(num_ranks=4, num_base_ranks=5), ValueError, "num_base_ranks"),
        (dict(num_ranks=4, num_base_ranks=0), ValueError, "num_base_ranks"),
        (dict(num_ranks=4, num_base_ranks=2, interpolation="cubic"), ValueError, "interpolation"),
        (dict(num_ranks=4, num_base_ranks=2, rank_position="end"), ValueError, "rank_position"),
        (dict(num_ranks=4, num_base_ranks=2, num_context_tokens=20, num_tokens_per_rank=2), ValueError, "context len"),
        (dict(num_ranks=4, num_base_ranks=2, init_rank_names=["a", "b", "c"]), ValueError, "init_rank_names"),
        (dict(num_ranks=4, num_base_ranks=2, init_rank_names="ab"), TypeError, "list"),
        (dict(num_ranks=4, num_base_ranks=2, init_context="   "), ValueError, "init_context"),
        (dict(num_ranks=4, num_base_ranks=2, num_tokens_per_rank=0), ValueError, "num_tokens_per_rank"),
    ],
)
def test_prompt_learner_bad_inputs(tiny_clip, tok, kwargs, err, match):
    with pytest.raises(err, match=match):
        RankPromptLearner(tiny_clip, tokenizer=tok, **kwargs)


def test_prompt_learner_rejects_non_clip(tok):
    with pytest.raises(TypeError, match="open_clip"):
        RankPromptLearner(nn.Linear(3, 3), num_ranks=3, num_base_ranks=1, tokenizer=tok)


# --------------------------------------------------------------------------------------------
# loss
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("N", [1, 2, 7, 32])
@pytest.mark.parametrize("R", [2, 5, 17])
@pytest.mark.parametrize("weights", [(1.0, 1.0), (1.0, 0.0), (0.3, 2.0)])
@pytest.mark.parametrize("sharpness", [10.0, 1.0])
def test_loss_matches_numpy_reference(N, R, weights, sharpness):
    g = torch.Generator().manual_seed(N * 100 + R)
    logits = (torch.randn(N, R, generator=g, dtype=torch.float64) * 5).requires_grad_(True)
    labels = torch.randint(0, R, (N,), generator=g)
    if N == 7:
        labels[:4] = labels[0]  # repeated ranks
    total, parts = OrdinalCLIPLoss(*weights, target_sharpness=sharpness).compute(logits, labels)
    total.backward()
    ref_total, ref_ce, ref_kl, ref_grad = ordinal_clip_loss_reference(logits.detach().numpy(), labels.numpy(), *weights, sharpness)
    assert total.dtype == torch.float64  # float64 logits (64-true) are computed in float64
    np.testing.assert_allclose(total.item(), ref_total, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(parts["ce"].item(), ref_ce, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(parts["kl"].item(), ref_kl, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(logits.grad.numpy(), ref_grad, rtol=1e-8, atol=1e-12)


def test_numpy_reference_gradient_is_the_derivative():
    """The analytic gradient of the NumPy reference agrees with central differences of its value."""
    rng = np.random.default_rng(0)
    logits, labels = rng.normal(size=(6, 4)) * 2, np.array([0, 0, 2, 3, 3, 3])
    _, _, _, grad = ordinal_clip_loss_reference(logits, labels, 0.7, 1.3, 10.0)
    num = np.zeros_like(logits)
    for i in range(6):
        for r in range(4):
            e = np.zeros_like(logits)
            e[i, r] = 1e-6
            num[i, r] = (ordinal_clip_loss_reference(logits + e, labels, 0.7, 1.3, 10.0)[0]
                         - ordinal_clip_loss_reference(logits - e, labels, 0.7, 1.3, 10.0)[0]) / 2e-6
    np.testing.assert_allclose(grad, num, rtol=1e-5, atol=1e-8)


def test_loss_bf16_stays_finite_and_float32():
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(16, 10, generator=g) * 100).bfloat16().requires_grad_(True)  # scale 1/0.01
    labels = torch.randint(0, 10, (16,), generator=g)
    total, _parts = ordinal_clip_loss(logits, labels)
    assert total.dtype == torch.float32 and torch.isfinite(total)
    total.backward()
    assert torch.isfinite(logits.grad.float()).all()
    ref_total = ordinal_clip_loss_reference(logits.detach().double().numpy(), labels.numpy(), 1.0, 1.0, 10.0)[0]
    np.testing.assert_allclose(total.item(), ref_total, rtol=1e-4)


def test_loss_bad_inputs():
    loss = OrdinalCLIPLoss()
    logits, labels = torch.randn(4, 3), torch.tensor([0, 1, 2, 1])
    with pytest.raises(ValueError, match="NaN"):
        loss(torch.full((4, 3), float("nan")), labels)
    with pytest.raises(ValueError, match="ranks in"):
        loss(logits, torch.tensor([0, 1, 3, 1]))
    with pytest.raises(ValueError, match="ranks in"):
        loss(logits, torch.tensor([0, -1, 2, 1]))
    with pytest.raises(TypeError, match="integer"):
        loss(logits, labels.float())
    with pytest.raises(ValueError, match="labels"):
        loss(logits, labels[:3])
    with pytest.raises(ValueError, match=r"\[N, R\]"):
        loss(logits[0], labels)
    with pytest.raises(ValueError, match="ce_weight"):
        OrdinalCLIPLoss(ce_weight=-1.0)
    with pytest.raises(ValueError, match="both 0"):
        OrdinalCLIPLoss(ce_weight=0.0, kl_weight=0.0)
    # the check can be turned off
    total = OrdinalCLIPLoss(check_finite=False)(torch.full((4, 3), float("nan")), labels)
    assert torch.isnan(total)


# --------------------------------------------------------------------------------------------
# prototype classifier
# --------------------------------------------------------------------------------------------


def test_prototype_classifier_logits_predictions_and_roundtrip(tiny_clip, tok, tmp_path):
    pl = RankPromptLearner(tiny_clip, num_ranks=6, num_base_ranks=3, num_context_tokens=4, tokenizer=tok)
    visual = tiny_clip.visual
    clf = PrototypeClassifier.from_prompt_learner(
        visual, pl, logit_scale=tiny_clip.logit_scale,
        rank_values=torch.arange(6) + 16.0,
        encoder_builder={"name": "open_clip_visual", "kwargs": {"embed_dim": 24, "vision_cfg": VISION}},
    )
    assert clf.prototypes.shape == (6, 24) and not any(isinstance(m, type(pl.text_encoder)) for m in clf.modules())
    images = torch.randn(5, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = clf(images)
        f = visual(images).double().numpy()
        p = pl().double().numpy()
    cos = (f / np.linalg.norm(f, axis=1, keepdims=True)) @ (p / np.linalg.norm(p, axis=1, keepdims=True)).T
    ref = math.exp(tiny_clip.logit_scale.item()) * cos
    np.testing.assert_allclose(logits.double().numpy(), ref, rtol=1e-4, atol=1e-4)

    prob = np.exp(ref - ref.max(1, keepdims=True))
    prob /= prob.sum(1, keepdims=True)
    values = np.arange(6) + 16.0
    np.testing.assert_allclose(clf.predict(images).numpy(), prob @ values, rtol=1e-4)
    np.testing.assert_array_equal(clf.predict(images, kind="argmax").numpy(), values[ref.argmax(1)])
    with pytest.raises(ValueError, match="kind"):
        logits_to_predictions(logits, kind="median")

    # builder export: state dict + builder kwargs, loadable with weights_only=True
    path = tmp_path / "export.pt"
    clf.save(path)
    loaded = PrototypeClassifier.load(path, allow_pickle=False)
    assert loaded.image_encoder is not visual
    with torch.no_grad():
        torch.testing.assert_close(loaded(images), logits, rtol=0, atol=0)
    torch.testing.assert_close(loaded.rank_values, clf.rank_values)

    # pickled export: any module (e.g. a non-open_clip encoder)
    enc = nn.Sequential(nn.Flatten(), nn.Linear(3 * 16 * 16, 24))
    clf2 = PrototypeClassifier(enc, torch.randn(6, 24), logit_scale=math.log(50.0))
    path2 = tmp_path / "export_pickled.pt"
    clf2.save(path2)
    with pytest.raises(ValueError, match="allow_pickle"):
        PrototypeClassifier.load(path2, allow_pickle=False)
    loaded2 = PrototypeClassifier.load(path2)
    with torch.no_grad():
        torch.testing.assert_close(loaded2(images), clf2(images), rtol=0, atol=0)

    torch.save({"something": 1}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="not a PrototypeClassifier export"):
        PrototypeClassifier.load(tmp_path / "other.pt")


def test_prototype_classifier_bad_inputs():
    enc = nn.Linear(4, 3)
    with pytest.raises(ValueError, match=r"\[R, D\]"):
        PrototypeClassifier(enc, torch.randn(3), 0.0)
    with pytest.raises(ValueError, match="NaN"):
        PrototypeClassifier(enc, torch.full((2, 3), float("nan")), 0.0)
    with pytest.raises(ValueError, match="rank_values"):
        PrototypeClassifier(enc, torch.randn(2, 3), 0.0, rank_values=[1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="encoder builder"):
        PrototypeClassifier(enc, torch.randn(2, 3), 0.0, encoder_builder={"name": "nope", "kwargs": {}})
    with pytest.raises(ValueError, match="features of shape"):
        PrototypeClassifier(enc, torch.randn(2, 5), 0.0)(torch.randn(2, 4))


# --------------------------------------------------------------------------------------------
# load_clip
# --------------------------------------------------------------------------------------------


@pytest.fixture
def tiny_registered(monkeypatch, tmp_path):
    """Register a tiny open_clip config and a fake pretrained tag, with nothing cached."""
    import open_clip.factory as factory
    import open_clip.pretrained as pretrained

    monkeypatch.setitem(factory._MODEL_CONFIGS, "cloc-test-tiny", TINY_CFG)
    monkeypatch.setitem(pretrained._PRETRAINED, "cloc-test-tiny", {"fake": {"hf_hub": "cloc-test/tiny-fake/"}})

    def no_download(*a, **k):  # any hub download attempt would be a failure of the fast path
        raise AssertionError("hf_hub_download must not be called")

    monkeypatch.setattr(pretrained, "hf_hub_download", no_download)
    return tmp_path / "hub"


def test_load_clip_unknown_name():
    with pytest.raises(ValueError, match="ViT-B-32") as info:
        load_clip("ViT-B32", pretrained=None)
    assert "Unknown open_clip model name" in str(info.value)


def test_load_clip_random_and_local_path(tiny_registered, tmp_path):
    model, tokenizer = load_clip("cloc-test-tiny", pretrained=None)
    assert isinstance(model, open_clip.CLIP) and tokenizer.context_length == CTX_LEN
    ckpt = tmp_path / "weights.pt"
    torch.save(model.state_dict(), ckpt)
    model2, _ = load_clip("cloc-test-tiny", pretrained=str(ckpt))
    for (k, a), (_, b) in zip(model.state_dict().items(), model2.state_dict().items(), strict=True):
        assert torch.equal(a, b), k
    with pytest.raises(ValueError, match="neither a known open_clip tag"):
        load_clip("cloc-test-tiny", pretrained=str(tmp_path / "missing.pt"))
    with pytest.raises(ValueError, match="precision"):
        load_clip("cloc-test-tiny", pretrained=None, precision="fp8")


def test_load_clip_offline_uncached_tag_fails_fast(tiny_registered, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(PretrainedUnavailableError, match="pretrained: null") as info:
        load_clip("cloc-test-tiny", pretrained="fake", cache_dir=str(tiny_registered))
    assert "HF_HUB_OFFLINE" in str(info.value)


def test_load_clip_unreachable_hub_fails_fast(tiny_registered, monkeypatch):
    """Not offline but the hub cannot be reached: one short probe, then a clear error (no retries)."""
    import huggingface_hub.constants as hfc

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(hfc, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hfc, "ENDPOINT", "http://127.0.0.1:9")  # discard port: connection refused
    monkeypatch.setattr(hub, "HUB_PROBE_TIMEOUT_S", 1.0)
    with pytest.raises(PretrainedUnavailableError, match="cannot be reached"):
        load_clip("cloc-test-tiny", pretrained="fake", cache_dir=str(tiny_registered))


def test_load_clip_cached_tag_loads_without_network(tiny_registered, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    ref, _ = load_clip("cloc-test-tiny", pretrained=None)
    snap = tiny_registered / "models--cloc-test--tiny-fake" / "snapshots" / ("0" * 40)
    snap.mkdir(parents=True)
    torch.save(ref.state_dict(), snap / "open_clip_pytorch_model.bin")
    (tiny_registered / "models--cloc-test--tiny-fake" / "refs").mkdir()
    (tiny_registered / "models--cloc-test--tiny-fake" / "refs" / "main").write_text("0" * 40)
    model, _ = load_clip("cloc-test-tiny", pretrained="fake", cache_dir=str(tiny_registered))
    for (k, a), (_, b) in zip(ref.state_dict().items(), model.state_dict().items(), strict=True):
        assert torch.equal(a, b), k
    assert os.environ["HF_HUB_OFFLINE"] == "1"
