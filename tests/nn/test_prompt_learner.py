"""The rank prompt learner of OrdinalCLIP: interpolation weights and ``RankPromptLearner``.

All models are tiny open_clip CLIPs built in-process (``make_clip`` in ``tests/nn/conftest.py``: width 32,
2 text layers, context 24), so the file runs in a few seconds after ``import open_clip``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

open_clip = pytest.importorskip("open_clip")

from cloc_lightning.nn.prompt_learner import RankPromptLearner, rank_interpolation_weights  # noqa: E402
from tests.nn.conftest import CTX_LEN, make_clip  # noqa: E402
from tests.references.ordinal_clip import interpolation_weights_formula  # noqa: E402


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
        tiny_clip,
        num_ranks=R,
        num_base_ranks=B,
        num_tokens_per_rank=T,
        num_context_tokens=N,
        rank_specific_context=rank_specific,
        interpolation=kind,
        rank_position=position,
        tokenizer=tok,
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
        model,
        num_ranks=3,
        num_base_ranks=3,
        init_context=context,
        init_rank_names=names,
        rank_position=position,
        tokenizer=tok,
        truncate_padding=truncate,
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
        tiny_clip,
        num_ranks=3,
        num_base_ranks=1,
        num_context_tokens=3,
        rank_specific_context=True,
        init_rank_names=["old"],
        tokenizer=tok,
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
    pl = RankPromptLearner(
        tiny_clip,
        num_ranks=10,
        num_base_ranks=3,
        init_rank_names=names,
        init_context="age estimation:",
        num_context_tokens=7,
        tokenizer=tok,
    )
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
    pl_b = RankPromptLearner(tiny_clip, num_ranks=10, num_base_ranks=2, init_rank_names=["child", "elder"], tokenizer=tok)
    want = table[[tok.encode("child")[0], tok.encode("elder")[0]]]
    torch.testing.assert_close(pl_b.base_rank_embeds.detach()[:, 0], want)
    pl_1 = RankPromptLearner(tiny_clip, num_ranks=5, num_base_ranks=1, init_rank_names=list("abcde"), tokenizer=tok)
    torch.testing.assert_close(pl_1.base_rank_embeds.detach()[0, 0], table[tok.encode("c")[0]])


def test_state_dict_can_exclude_text_encoder(tok):
    a = make_clip(seed=3)
    pl = RankPromptLearner(a, num_ranks=4, num_base_ranks=2, num_context_tokens=3, tokenizer=tok, save_text_encoder=False)
    parent = nn.ModuleDict({"prompt": pl, "head": nn.Linear(2, 2)})
    sd = parent.state_dict()
    assert "prompt.context_embeds" in sd and "head.weight" in sd
    assert not [k for k in sd if "text_encoder" in k]
    # a fresh learner on an identical CLIP loads it strictly and gives identical features
    pl2 = RankPromptLearner(make_clip(seed=3), num_ranks=4, num_base_ranks=2, num_context_tokens=3, tokenizer=tok, save_text_encoder=False)
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
