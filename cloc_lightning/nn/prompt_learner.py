"""OrdinalCLIP building blocks: rank-embedding interpolation, the rank prompt learner and the
exported prototype classifier.

OrdinalCLIP (Li, Huang, Zhu, Tang, Li, Zhou, Lu, "OrdinalCLIP: Learning Rank Prompts for
Language-Guided Ordinal Regression", NeurIPS 2022, arXiv 2206.02338; reference code
https://github.com/xk-huang/OrdinalCLIP, ``ordinalclip/models/prompt_leaners/``) turns ordinal
regression into image–text matching: every rank ``r`` gets a prompt

    [SOT] context_1 … context_N [rank_r,1 … rank_r,T] . [EOT] [pad] …

whose CLIP text feature is the rank's *language prototype*. The context tokens and the rank
embeddings are learned, the text encoder is frozen. The rank embeddings of all R ranks are
linear interpolations of B ≤ R learnable *base* rank embeddings, which builds the order of the
ranks into the prompts (the paper's "learnable rank embeddings" with interpolation).

After training the R prototypes are fixed vectors, so the text encoder can be dropped:
:class:`PrototypeClassifier` predicts from an image with the image encoder and an [R, D] matrix,
the cost of a linear head.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "INTERPOLATION_KINDS",
    "RANK_POSITIONS",
    "rank_interpolation_weights",
    "FrozenTextEncoder",
    "RankPromptLearner",
    "PrototypeClassifier",
    "ENCODER_BUILDERS",
    "register_encoder_builder",
    "logits_to_predictions",
]

INTERPOLATION_KINDS = ("linear", "inv_prop", "normal")
RANK_POSITIONS = ("tail", "front", "middle")

InterpolationKind = Literal["linear", "inv_prop", "normal"]
RankPosition = Literal["tail", "front", "middle"]


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} ({value!r})")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def _check_ranks(num_ranks: Any, num_base_ranks: Any) -> None:
    _check_int("num_ranks", num_ranks, 0)
    _check_int("num_base_ranks", num_base_ranks, 0)
    if num_ranks < 2:
        raise ValueError(f"num_ranks must be >= 2 (an ordinal problem needs at least two ranks), got {num_ranks}")
    if not 1 <= num_base_ranks <= num_ranks:
        raise ValueError(
            f"num_base_ranks must satisfy 1 <= num_base_ranks <= num_ranks={num_ranks}, got {num_base_ranks}; "
            "the reference uses a few base ranks (e.g. 3) interpolated to all ranks."
        )


def rank_interpolation_weights(
    num_ranks: int,
    num_base_ranks: int,
    kind: InterpolationKind = "linear",
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """Weights that build R rank embeddings from B base rank embeddings (OrdinalCLIP, arXiv 2206.02338).

    Base rank ``b`` sits at position ``p_b = linspace(0, R-1, B)[b]`` on the rank axis (B = 1: the
    middle, ``(R-1)/2``). With ``d[r, b] = |r - p_b|`` the unnormalised weight is

    * ``linear``:   ``1 - d / (R-1)``
    * ``inv_prop``: ``1 / (d + 1e-5)``
    * ``normal``:   ``exp(-d**2)``

    and each row is normalised to sum to 1, so ``rank_embedding[r] = sum_b w[r, b] * base[b]``.
    Same formulas and base positions as the reference (``RankPromptLearner.interpolation_functions``
    and ``create_interpolation_weights`` in xk-huang/OrdinalCLIP).

    Numerics: computed in float64. ``linear`` is clamped at 0 (it cannot go negative because
    ``d <= R-1``; the clamp only guards rounding).

    **Deliberate fix of** ``normal``: it is normalised in log space (``softmax(-d**2)`` over b),
    the same value wherever the reference's formula is finite, but never 0/0. The reference
    computes ``exp(-d**2) / sum_b exp(-d**2)`` in float32 (the CLIP dtype): ``exp`` underflows to
    exactly 0 once ``d**2`` exceeds about 104, so every rank farther than ~10.2 from *all* bases
    gets a row of NaN, and the NaN rank embeddings make those ranks' text features (and the
    loss) NaN. That happens for every R >= 22 with B = 1, R >= 23 with B = 2, R >= 44 with
    B = 3 (38 of 80 rows at R = 80, 58 of 101 at R = 101), R = 63 and R >= 65 with B = 4, ... Here such
    rows go to the nearest base(s), the limit of the formula. Where the reference's row sum is
    a normal float32 the two agree to float32 rounding (<= 4e-5, from the base positions
    ``linspace(0, R-1, B)`` rounded to float32 there); where it is subnormal the reference's
    weights are quantised (off by up to ~2e-2). ``linear`` and ``inv_prop`` agree with the
    reference to ~1e-6. Test: ``tests/test_fidelity_ordinal_clip.py``.

    Args:
        num_ranks: R >= 2.
        num_base_ranks: B with 1 <= B <= R.
        kind: ``"linear"``, ``"inv_prop"`` or ``"normal"``.
        dtype: dtype of the returned tensor.

    Returns:
        ``[R, B]`` tensor, non-negative, rows summing to 1.
    """
    _check_ranks(num_ranks, num_base_ranks)
    if kind not in INTERPOLATION_KINDS:
        raise ValueError(f"interpolation must be one of {INTERPOLATION_KINDS}, got {kind!r}")
    r = torch.arange(num_ranks, dtype=torch.float64)
    if num_base_ranks == 1:
        pos = torch.tensor([(num_ranks - 1) / 2.0], dtype=torch.float64)
    else:
        pos = torch.linspace(0.0, num_ranks - 1.0, num_base_ranks, dtype=torch.float64)
    d = (r[:, None] - pos[None, :]).abs()
    if kind == "linear":
        w = (1.0 - d / (num_ranks - 1)).clamp_min(0.0)
        w = w / w.sum(dim=1, keepdim=True)
    elif kind == "inv_prop":
        w = 1.0 / (d + 1e-5)
        w = w / w.sum(dim=1, keepdim=True)
    else:  # normal
        w = torch.softmax(-(d * d), dim=1)
    return w.to(dtype)


# --------------------------------------------------------------------------------------------
# Frozen text encoder
# --------------------------------------------------------------------------------------------


def _text_tower(clip_model: nn.Module) -> tuple[nn.Module, str]:
    """The object holding open_clip's text-transformer parts, and its pool type."""
    if hasattr(clip_model, "token_embedding") and hasattr(clip_model, "transformer"):
        src = clip_model  # open_clip.CLIP keeps the text tower's parts on the model itself
        pool = getattr(clip_model, "text_pool_type", "argmax")
    elif hasattr(getattr(clip_model, "text", None), "token_embedding"):
        src = clip_model.text  # CustomTextCLIP with open_clip's TextTransformer
        pool = getattr(src, "pool_type", "argmax")
    else:
        raise TypeError(
            f"{type(clip_model).__name__} has no open_clip text transformer (token_embedding, "
            "positional_embedding, transformer, ln_final, text_projection). Use an open_clip CLIP model "
            "with the standard text tower, e.g. load_clip('ViT-B-32' | 'RN50' | 'ViT-S-32-alt', ...)."
        )
    if getattr(src, "cls_emb", None) is not None or getattr(src, "use_pad_mask", False):
        raise ValueError(
            "text towers with a class token or padding mask (CoCa-style) are not supported by the rank "
            "prompt learner; use a CLIP model with the standard text tower (e.g. 'ViT-B-32', 'RN50')."
        )
    if pool not in ("argmax", "eos"):
        raise ValueError(
            f"text pool type {pool!r} is not supported (the prompt learner pools at the EOT token like "
            "CLIP's 'argmax' pooling); use a CLIP model with the standard text tower."
        )
    return src, pool


class FrozenTextEncoder(nn.Module):
    """CLIP's text transformer applied to token *embeddings* (not token ids), frozen.

    ``features = text_projection(ln_final(transformer(x + positional_embedding))[:, eot])``,
    as ``open_clip.CLIP.encode_text`` but starting after the token-embedding lookup, so that
    learned prompt embeddings can be fed in (reference: ``TextEncoder`` in
    ``ordinalclip/models/ordinalclip.py``).

    All its parameters have ``requires_grad=False`` and it stays in eval mode (``train()`` is a
    no-op for it); gradients still flow *through* it to the input embeddings.

    Only the rows of the token-embedding table that the prompt learner needs at run time
    (``special_token_ids``) are kept, as the buffer ``special_embeddings`` ``[K, W]``; the
    ~25M-parameter table itself is not referenced, so it is freed with the CLIP model.

    Args:
        clip_model: open_clip ``CLIP`` (or ``CustomTextCLIP`` with open_clip's ``TextTransformer``).
        special_token_ids: token ids whose embeddings are kept (e.g. SOT, '.', EOT, pad).
    """

    def __init__(self, clip_model: nn.Module, special_token_ids: Sequence[int]) -> None:
        super().__init__()
        src, _ = _text_tower(clip_model)
        self.transformer = src.transformer
        self.ln_final = src.ln_final
        self.positional_embedding = src.positional_embedding
        self.text_projection = src.text_projection
        mask = getattr(clip_model, "attn_mask", None) if src is clip_model else getattr(src, "attn_mask", None)
        self.register_buffer("attn_mask", mask, persistent=False)
        ids = torch.as_tensor(list(special_token_ids), dtype=torch.long)
        with torch.no_grad():
            special = src.token_embedding.weight[ids.to(src.token_embedding.weight.device)].detach().clone()
        self.register_buffer("special_embeddings", special)
        self.requires_grad_(False)
        super().train(False)

    @property
    def width(self) -> int:
        """Token width W of the text transformer."""
        return int(self.positional_embedding.shape[-1])

    @property
    def context_length(self) -> int:
        """Number of positions L of the text transformer (77 for CLIP)."""
        return int(self.positional_embedding.shape[0])

    @property
    def output_dim(self) -> int:
        """Dimension D of the text features (CLIP's joint embedding width)."""
        proj = self.text_projection
        if proj is None:
            return self.width
        if isinstance(proj, nn.Linear):
            return int(proj.out_features)
        return int(proj.shape[1])

    @property
    def causal(self) -> bool:
        """True when attention is causal, so tokens after the EOT do not change its output."""
        return self.attn_mask is not None

    def cast_dtype(self) -> torch.dtype:
        """dtype the transformer runs in (fp16/bf16 for open_clip's pure-precision models)."""
        get = getattr(self.transformer, "get_cast_dtype", None)
        return get() if callable(get) else self.positional_embedding.dtype

    def train(self, mode: bool = True) -> FrozenTextEncoder:  # noqa: D102 - frozen: always eval
        return super().train(False)

    def forward(self, embeddings: Tensor, eot_index: int | Tensor) -> Tensor:
        """Text features from token embeddings.

        Args:
            embeddings: ``[R, L', W]`` token embeddings (without positions), ``L' <= context_length``.
            eot_index: position of the EOT token, an int or a LongTensor ``[R]``.

        Returns:
            ``[R, D]`` text features (not normalised), in the transformer's dtype.
        """
        length = embeddings.shape[1]
        if length > self.context_length:
            raise ValueError(f"prompt length {length} exceeds the text context length {self.context_length}")
        dtype = self.cast_dtype()
        x = embeddings.to(dtype) + self.positional_embedding[:length].to(dtype)
        mask = None if self.attn_mask is None else self.attn_mask[:length, :length]
        if hasattr(self.transformer, "batch_first"):
            # open_clip >= 2.23: the Transformer takes [N, L, W] and transposes internally if needed
            x = self.transformer(x, attn_mask=mask)
        else:  # older open_clip: the transformer works on [L, N, W]
            x = self.transformer(x.permute(1, 0, 2), attn_mask=mask).permute(1, 0, 2)
        rows = torch.arange(x.shape[0], device=x.device)
        x = self.ln_final(x[rows, eot_index])  # LayerNorm is per token: pooling first is identical
        proj = self.text_projection
        if proj is None:
            return x
        if isinstance(proj, nn.Linear):
            return proj(x)
        return x @ proj


# --------------------------------------------------------------------------------------------
# Rank prompt learner
# --------------------------------------------------------------------------------------------


def _default_tokenizer(context_length: int) -> Any:
    from open_clip.tokenizer import SimpleTokenizer

    return SimpleTokenizer(context_length=context_length)


def _encode(tokenizer: Any, text: str) -> list[int]:
    """BPE ids of ``text`` without SOT/EOT."""
    enc = getattr(tokenizer, "encode", None)
    if enc is None or not hasattr(tokenizer, "sot_token_id"):
        raise TypeError(
            f"tokenizer {type(tokenizer).__name__} is not open_clip's CLIP BPE tokenizer (needs encode(), "
            "sot_token_id, eot_token_id); pass open_clip.get_tokenizer(<CLIP model>) or leave tokenizer=None."
        )
    return [int(t) for t in enc(text)]


class RankPromptLearner(nn.Module):
    """Learnable rank prompts on a frozen CLIP text encoder (OrdinalCLIP).

    For every rank r the prompt is ``[SOT] body . [EOT] [pad]…`` padded to CLIP's context length,
    with ``body`` the N context tokens and the T rank tokens of rank r placed by ``rank_position``:

    * ``tail``:   ``ctx_1 … ctx_N  rank_r``   (``"the age of the person is <r>"``)
    * ``front``:  ``rank_r  ctx_1 … ctx_N``
    * ``middle``: ``ctx_1 … ctx_{N//2}  rank_r  ctx_{N//2+1} … ctx_N``

    The rank tokens are ``rank_embeddings[r] = sum_b interpolation_weights[r, b] * base_embeddings[b]``
    (see :func:`rank_interpolation_weights`). ``forward()`` returns the R text features
    ``[R, D]`` = text_projection(ln_final(transformer(prompt + positions))[EOT]) — the language
    prototypes. Reference: ``RankPromptLearner`` / ``PlainPromptLearner`` in xk-huang/OrdinalCLIP.

    Parameters (learned): ``context_embeds`` ``[N, W]`` (or ``[R, N, W]`` rank-specific),
    ``base_rank_embeds`` ``[B, T, W]``; both float32 whatever the text encoder's precision.
    Everything in ``text_encoder`` is frozen and excluded from :meth:`trainable_parameters` /
    :meth:`param_groups` — build the optimiser from those, not from ``.parameters()``.

    Initialisation:

    * context: N(0, 0.02), or the token embeddings of ``init_context`` (then N = number of
      BPE tokens of that text and ``num_context_tokens`` is ignored);
    * base ranks: N(0, 0.02), or the token embeddings of rank names. ``init_rank_names`` may
      hold B names (one per base rank, in rank order) or R names (one per rank; the B names at
      the base positions ``round(linspace(0, R-1, B))`` — Python's round, half to even; B = 1:
      the middle rank ``round((R-1)/2)`` — are used).
      T then becomes the largest BPE token count among the used names and shorter names are
      padded with the pad token's embedding (id 0), as the reference pads with token 0.

    Speed: attention is causal in CLIP, so tokens after the EOT never change the EOT output;
    with ``truncate_padding=True`` (default) the transformer runs on the first
    ``eot_index + 1`` positions only (e.g. 14 of 77), which gives the same features.

    Args:
        clip_model: open_clip CLIP model (e.g. from :func:`cloc_lightning.nn.clip.load_clip`);
            only its text parts are kept. Build the prompt learner *after* loading weights.
        num_ranks: R >= 2.
        num_base_ranks: B, 1 <= B <= R (reference default 3).
        num_tokens_per_rank: T >= 1 tokens per rank (ignored with ``init_rank_names``).
        num_context_tokens: N >= 0 context tokens (ignored with ``init_context``).
        init_context: text to initialise the context from, e.g.
            ``"age estimation: the age of the person is"``; ``None`` → random. Underscores are
            read as spaces (as in the reference, for command-line values); same for rank names.
        rank_specific_context: one context per rank (``[R, N, W]``) instead of a shared one.
        init_rank_names: B or R names to initialise the base rank embeddings; ``None`` → random.
        interpolation: ``"linear"``, ``"inv_prop"`` or ``"normal"``.
        rank_position: ``"tail"``, ``"front"`` or ``"middle"``.
        tokenizer: open_clip CLIP tokenizer (``load_clip``'s second output); default
            ``open_clip.tokenizer.SimpleTokenizer``.
        save_text_encoder: keep the frozen text-encoder weights in ``state_dict()``. Default True
            (safe: checkpoints are self-contained, also for randomly initialised CLIPs). With
            False the ``text_encoder.*`` keys are left out of ``state_dict()`` and not required by
            ``load_state_dict()``; only do this when the text encoder is re-created identically
            from pretrained weights.
        truncate_padding: run the text transformer only up to the EOT position (exact, faster).

    Example:
        >>> clip, tokenizer = load_clip("ViT-S-32-alt", pretrained=None)  # doctest: +SKIP
        >>> prompts = RankPromptLearner(clip, num_ranks=100, num_base_ranks=3,
        ...                             init_context="the age of the person is", tokenizer=tokenizer)
        >>> prototypes = prompts()                      # [100, 256] text features
        >>> groups = prompts.param_groups()             # {"context": [...], "ranks": [...]}
        >>> opt = torch.optim.Adam([{"params": groups["context"], "lr": 1e-3},
        ...                         {"params": groups["ranks"], "lr": 1e-3}])
    """

    def __init__(
        self,
        clip_model: nn.Module,
        num_ranks: int,
        num_base_ranks: int = 3,
        num_tokens_per_rank: int = 1,
        num_context_tokens: int = 10,
        init_context: str | None = None,
        rank_specific_context: bool = False,
        init_rank_names: Sequence[str] | None = None,
        interpolation: InterpolationKind = "linear",
        rank_position: RankPosition = "tail",
        tokenizer: Any = None,
        save_text_encoder: bool = True,
        truncate_padding: bool = True,
    ) -> None:
        super().__init__()
        _check_ranks(num_ranks, num_base_ranks)
        _check_int("num_tokens_per_rank", num_tokens_per_rank, 1)
        _check_int("num_context_tokens", num_context_tokens, 0)
        if interpolation not in INTERPOLATION_KINDS:
            raise ValueError(f"interpolation must be one of {INTERPOLATION_KINDS}, got {interpolation!r}")
        if rank_position not in RANK_POSITIONS:
            raise ValueError(f"rank_position must be one of {RANK_POSITIONS}, got {rank_position!r}")
        src, _ = _text_tower(clip_model)
        context_length = int(src.positional_embedding.shape[0])
        if tokenizer is None:
            tokenizer = _default_tokenizer(context_length)
        _encode(tokenizer, "")  # type check
        sot, eot = int(tokenizer.sot_token_id), int(tokenizer.eot_token_id)
        period = _encode(tokenizer, ".")
        if len(period) != 1:
            raise ValueError(f"the tokenizer encodes '.' as {period}, expected one token")
        pad = 0  # open_clip's CLIP tokenizer pads with id 0
        token_table = src.token_embedding.weight
        width = int(token_table.shape[1])

        def lookup(ids: list[int]) -> Tensor:
            with torch.no_grad():
                idx = torch.as_tensor(ids, dtype=torch.long, device=token_table.device)
                return token_table[idx].detach().float().cpu().clone()

        # context
        if init_context is not None:
            if not isinstance(init_context, str) or not init_context.strip():
                raise ValueError(f"init_context must be a non-empty string or None, got {init_context!r}")
            ctx_ids = _encode(tokenizer, init_context.replace("_", " "))
            num_context_tokens = len(ctx_ids)
            context = lookup(ctx_ids)
            if rank_specific_context:
                context = context[None].repeat(num_ranks, 1, 1)
        else:
            shape = (num_ranks, num_context_tokens, width) if rank_specific_context else (num_context_tokens, width)
            context = torch.empty(shape)
            nn.init.normal_(context, std=0.02)

        # base rank embeddings
        if init_rank_names is not None:
            names = self._select_rank_names(init_rank_names, num_ranks, num_base_ranks)
            name_ids = [_encode(tokenizer, str(n).replace("_", " ")) for n in names]
            empty = [n for n, ids in zip(names, name_ids) if not ids]
            if empty:
                raise ValueError(f"init_rank_names contains names with no tokens: {empty}")
            num_tokens_per_rank = max(len(ids) for ids in name_ids)
            base = torch.stack([lookup(ids + [pad] * (num_tokens_per_rank - len(ids))) for ids in name_ids])
        else:
            base = torch.empty(num_base_ranks, num_tokens_per_rank, width)
            nn.init.normal_(base, std=0.02)

        # <sot> body <.> <eot> must fit in the context length
        needed = 1 + num_context_tokens + num_tokens_per_rank + 2
        if needed > context_length:
            raise ValueError(
                f"prompt needs {needed} tokens (SOT + {num_context_tokens} context + {num_tokens_per_rank} rank + "
                f"'.' + EOT) but the text encoder's context length is {context_length}; use fewer context "
                "tokens / tokens per rank, or a shorter init_context / rank names."
            )

        self.num_ranks = num_ranks
        self.num_base_ranks = num_base_ranks
        self.num_tokens_per_rank = num_tokens_per_rank
        self.num_context_tokens = num_context_tokens
        self.rank_specific_context = bool(rank_specific_context)
        self.interpolation = interpolation
        self.rank_position = rank_position
        self.truncate_padding = bool(truncate_padding)
        self.save_text_encoder = bool(save_text_encoder)
        self.eot_index = needed - 1
        self.token_ids = {"sot": sot, "period": period[0], "eot": eot, "pad": pad}

        self.context_embeds = nn.Parameter(context)
        self.base_rank_embeds = nn.Parameter(base)
        self.register_buffer(
            "interpolation_weights",
            rank_interpolation_weights(num_ranks, num_base_ranks, interpolation),
            persistent=False,
        )
        self.text_encoder = FrozenTextEncoder(clip_model, [sot, period[0], eot, pad])
        if not self.save_text_encoder:
            if hasattr(self, "register_state_dict_post_hook"):  # public since torch 2.4
                self.register_state_dict_post_hook(_drop_text_encoder_keys)
            else:  # pragma: no cover - older torch
                self._register_state_dict_hook(_drop_text_encoder_keys)
            if hasattr(self, "register_load_state_dict_pre_hook"):  # public since torch 2.4
                self.register_load_state_dict_pre_hook(_fill_text_encoder_keys)
            else:  # pragma: no cover - older torch
                self._register_load_state_dict_pre_hook(_fill_text_encoder_keys, with_module=True)

    # -- construction helpers ---------------------------------------------------------------
    @staticmethod
    def _select_rank_names(names: Sequence[str], num_ranks: int, num_base_ranks: int) -> list[str]:
        if isinstance(names, str) or not isinstance(names, Sequence):
            raise TypeError(f"init_rank_names must be a list of strings, got {type(names).__name__}")
        names = list(names)
        if len(names) == num_base_ranks:
            return names
        if len(names) == num_ranks:
            if num_base_ranks == 1:
                idx = [int(round((num_ranks - 1) / 2))]
            else:
                idx = [int(round(p)) for p in torch.linspace(0, num_ranks - 1, num_base_ranks).tolist()]
            return [names[i] for i in idx]
        raise ValueError(
            f"init_rank_names has {len(names)} names; give num_base_ranks={num_base_ranks} names (one per base "
            f"rank) or num_ranks={num_ranks} names (one per rank, the base positions are picked)"
        )

    # -- parameters -----------------------------------------------------------------------------
    def param_groups(self) -> dict[str, list[nn.Parameter]]:
        """Trainable parameters by role, for separate learning rates.

        Returns:
            ``{"context": [context_embeds], "ranks": [base_rank_embeds]}``.
        """
        return {"context": [self.context_embeds], "ranks": [self.base_rank_embeds]}

    def trainable_parameters(self) -> list[nn.Parameter]:
        """The learned parameters (context and base rank embeddings), never the text encoder."""
        return [p for group in self.param_groups().values() for p in group]

    # -- forward ------------------------------------------------------------------------------
    @property
    def embed_dim(self) -> int:
        """Dimension D of the text features (= CLIP's image feature dimension)."""
        return self.text_encoder.output_dim

    @property
    def context_length(self) -> int:
        """Context length L of the text encoder (77 for CLIP)."""
        return self.text_encoder.context_length

    def rank_embeddings(self) -> Tensor:
        """``[R, T, W]`` rank-token embeddings, ``einsum('rb,btw->rtw', weights, base)``."""
        return torch.einsum("rb,btw->rtw", self.interpolation_weights.to(self.base_rank_embeds), self.base_rank_embeds)

    def prompt_embeddings(self, length: int | None = None) -> Tensor:
        """The assembled prompts as token embeddings (before positional embeddings).

        Args:
            length: number of positions to return, ``eot_index + 1 <= length <= context_length``;
                default the full context length (pad embeddings after the EOT).

        Returns:
            ``[R, length, W]`` float32: position 0 SOT, 1..N+T the body (context and rank tokens as
            ``rank_position`` says), then '.', EOT at ``eot_index`` and pad embeddings.
        """
        length = self.context_length if length is None else int(length)
        if not self.eot_index + 1 <= length <= self.context_length:
            raise ValueError(f"length must be in [{self.eot_index + 1}, {self.context_length}], got {length}")
        R, W = self.num_ranks, self.text_encoder.width
        special = self.text_encoder.special_embeddings.detach().to(self.context_embeds)  # sot, '.', eot, pad
        sot, period, eot, pad = (special[i].expand(R, 1, W) for i in range(4))
        ctx = self.context_embeds
        if ctx.dim() == 2:
            ctx = ctx.unsqueeze(0).expand(R, -1, -1)
        ranks = self.rank_embeddings()
        if self.rank_position == "tail":
            body = [ctx, ranks]
        elif self.rank_position == "front":
            body = [ranks, ctx]
        else:
            half = self.num_context_tokens // 2
            body = [ctx[:, :half], ranks, ctx[:, half:]]
        parts = [sot, *body, period, eot]
        n_pad = length - (self.eot_index + 1)
        if n_pad:
            parts.append(special[3].expand(R, n_pad, W))
        return torch.cat(parts, dim=1)

    def forward(self) -> Tensor:
        """Language prototypes of all ranks.

        Returns:
            ``[R, D]`` text features (not normalised), in the text encoder's dtype.
        """
        length = self.eot_index + 1 if (self.truncate_padding and self.text_encoder.causal) else None
        return self.text_encoder(self.prompt_embeddings(length), self.eot_index)

    def extra_repr(self) -> str:
        return (
            f"num_ranks={self.num_ranks}, num_base_ranks={self.num_base_ranks}, "
            f"num_context_tokens={self.num_context_tokens}, num_tokens_per_rank={self.num_tokens_per_rank}, "
            f"rank_specific_context={self.rank_specific_context}, interpolation={self.interpolation!r}, "
            f"rank_position={self.rank_position!r}"
        )


def _drop_text_encoder_keys(module: nn.Module, state_dict: dict[str, Any], prefix: str, local_metadata: Any) -> None:
    for key in [k for k in state_dict if k.startswith(prefix + "text_encoder.")]:
        del state_dict[key]


def _fill_text_encoder_keys(module: nn.Module, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
    """Load pre-hook: text-encoder keys absent from ``state_dict`` keep their current values."""
    own = prefix + "text_encoder."
    for key, value in module.text_encoder.state_dict().items():
        state_dict.setdefault(own + key, value)


# --------------------------------------------------------------------------------------------
# Exported classifier
# --------------------------------------------------------------------------------------------

#: Builders that re-create an image encoder's architecture from JSON-like kwargs when loading an
#: exported :class:`PrototypeClassifier` (no pickled code needed). Register your own with
#: :func:`register_encoder_builder`.
ENCODER_BUILDERS: dict[str, Callable[..., nn.Module]] = {}


def register_encoder_builder(name: str, builder: Callable[..., nn.Module] | None = None) -> Any:
    """Register ``builder(**kwargs) -> nn.Module`` under ``name`` (usable as a decorator)."""

    def deco(fn: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
        ENCODER_BUILDERS[name] = fn
        return fn

    return deco(builder) if builder is not None else deco


def _open_clip_visual(**kwargs: Any) -> nn.Module:
    from .clip import build_open_clip_visual

    return build_open_clip_visual(**kwargs)


register_encoder_builder("open_clip_visual", _open_clip_visual)

_FORMAT = "cloc_lightning.PrototypeClassifier"
_FORMAT_VERSION = 1


class PrototypeClassifier(nn.Module):
    """Image encoder + fixed language prototypes: OrdinalCLIP at inference, no text encoder.

    ``logits = exp(logit_scale) * cos(image_encoder(x), prototypes)``: one ``[N, D] x [D, R]``
    matmul on the normalised image features, i.e. the cost of a linear head (the prototypes
    are stored already L2-normalised). The paper (arXiv 2206.02338) points out that only the
    language prototypes need to be kept, with zero extra cost over a linear head; reference
    ``OrdinalCLIP.forward`` (``logit_scale.exp() * image @ text.T``).

    Buffers: ``prototypes`` ``[R, D]`` (unit rows), ``logit_scale`` (scalar, the *log* of the
    multiplier, like CLIP's ``logit_scale``), ``rank_values`` ``[R]`` (the value of each rank
    used by predictions, default ``0..R-1``).

    File format (:meth:`save` / :meth:`load`), a ``torch.save`` dict:

    * with ``encoder_builder={"name": ..., "kwargs": {...}}`` (a name in :data:`ENCODER_BUILDERS`,
      e.g. ``"open_clip_visual"`` with ``{"clip_model": "ViT-B-32"}``), the image encoder is
      stored as its ``state_dict`` + builder name/kwargs and loaded with
      ``torch.load(weights_only=True)``: no pickled code, robust across library versions as
      long as the architecture is unchanged;
    * without a builder, the image encoder module is pickled whole (works for any module, e.g.
      a timm backbone + projection); loading then needs ``weights_only=False``, the defining
      classes importable, and is for files you trust (``load(..., allow_pickle=True)``, default).

    Args:
        image_encoder: module mapping images ``[N, ...]`` to features ``[N, D]``.
        prototypes: ``[R, D]`` language prototypes (normalised here).
        logit_scale: log of the logit multiplier (CLIP's ``model.logit_scale``, e.g. ``log(100)``).
        rank_values: ``[R]`` value of each rank (e.g. ages), default ``arange(R)``.
        encoder_builder: ``{"name": str, "kwargs": dict}`` to rebuild ``image_encoder`` on load.

    Example:
        >>> clf = PrototypeClassifier.from_prompt_learner(image_encoder, prompt_learner,
        ...                                               logit_scale=clip.logit_scale)  # doctest: +SKIP
        >>> clf.save("ordinalclip_export.pt")
        >>> clf = PrototypeClassifier.load("ordinalclip_export.pt")
        >>> ages = clf.predict(images)                    # [N] expected rank values
    """

    def __init__(
        self,
        image_encoder: nn.Module,
        prototypes: Tensor,
        logit_scale: float | Tensor,
        rank_values: Tensor | Sequence[float] | None = None,
        encoder_builder: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(image_encoder, nn.Module):
            raise TypeError(f"image_encoder must be an nn.Module, got {type(image_encoder).__name__}")
        prototypes = torch.as_tensor(prototypes).detach()
        if prototypes.dim() != 2 or prototypes.shape[0] < 2:
            raise ValueError(f"prototypes must be [R, D] with R >= 2, got shape {tuple(prototypes.shape)}")
        if not torch.isfinite(prototypes).all():
            raise ValueError("prototypes contain NaN/inf (diverged training?); re-export from a finite checkpoint")
        R = prototypes.shape[0]
        if rank_values is None:
            rank_values = torch.arange(R, dtype=torch.float32)
        rank_values = torch.as_tensor(rank_values, dtype=torch.float32).detach().clone()
        if rank_values.shape != (R,):
            raise ValueError(f"rank_values must have shape [{R}], got {tuple(rank_values.shape)}")
        if encoder_builder is not None:
            if not isinstance(encoder_builder, dict) or set(encoder_builder) - {"name", "kwargs"}:
                raise ValueError("encoder_builder must be {'name': <registered builder>, 'kwargs': {...}}")
            if encoder_builder.get("name") not in ENCODER_BUILDERS:
                raise ValueError(
                    f"unknown encoder builder {encoder_builder.get('name')!r}; registered: {sorted(ENCODER_BUILDERS)}"
                )
            encoder_builder = {"name": encoder_builder["name"], "kwargs": dict(encoder_builder.get("kwargs") or {})}
        self.image_encoder = image_encoder
        self.encoder_builder = encoder_builder
        self.register_buffer("prototypes", F.normalize(prototypes.float(), dim=-1))
        scale = torch.as_tensor(logit_scale, dtype=torch.float32).detach().clone().reshape(())
        self.register_buffer("logit_scale", scale)
        self.register_buffer("rank_values", rank_values)

    @classmethod
    def from_prompt_learner(
        cls,
        image_encoder: nn.Module,
        prompt_learner: RankPromptLearner,
        logit_scale: float | Tensor,
        rank_values: Tensor | Sequence[float] | None = None,
        encoder_builder: dict[str, Any] | None = None,
    ) -> PrototypeClassifier:
        """Compute the R prototypes once (no grad) and wrap them with ``image_encoder``.

        Args:
            image_encoder: the trained image encoder (features ``[N, D]``).
            prompt_learner: the trained :class:`RankPromptLearner` (its ``forward()`` gives ``[R, D]``).
            logit_scale: log of the multiplier used in training (CLIP's ``logit_scale``).
            rank_values: ``[R]`` rank values, default ``arange(R)``.
            encoder_builder: see the class docstring.
        """
        with torch.no_grad():
            prototypes = prompt_learner().float().cpu()
        return cls(image_encoder, prototypes, logit_scale, rank_values, encoder_builder)

    @property
    def num_ranks(self) -> int:
        """R."""
        return int(self.prototypes.shape[0])

    def forward(self, images: Tensor) -> Tensor:
        """``[N, ...]`` images → ``[N, R]`` float32 logits ``exp(logit_scale) * cos(f(x), prototypes)``."""
        feats = self.image_encoder(images)
        if feats.dim() != 2 or feats.shape[1] != self.prototypes.shape[1]:
            raise ValueError(
                f"image encoder gives features of shape {tuple(feats.shape)}, expected [N, {self.prototypes.shape[1]}]"
            )
        return self.logits_from_features(feats)

    def logits_from_features(self, features: Tensor) -> Tensor:
        """``[N, D]`` image features → ``[N, R]`` float32 logits."""
        feats = F.normalize(features.float(), dim=-1)
        return self.logit_scale.exp() * (feats @ self.prototypes.t())

    @torch.no_grad()
    def predict(self, images: Tensor, kind: Literal["expectation", "argmax"] = "expectation") -> Tensor:
        """Predicted rank values ``[N]`` (float32) for ``[N, ...]`` images.

        ``"expectation"``: ``sum_r softmax(logits)_r * rank_values[r]``; ``"argmax"``:
        ``rank_values[argmax_r logits]`` (the two predictions of the reference's metrics).
        """
        return logits_to_predictions(self(images), self.rank_values, kind)

    # -- file I/O -------------------------------------------------------------------------------
    def save(self, path: str | Any) -> None:
        """Write a self-contained file (see the class docstring for the format)."""
        payload: dict[str, Any] = {
            "format": _FORMAT,
            "version": _FORMAT_VERSION,
            "prototypes": self.prototypes.detach().cpu(),
            "logit_scale": self.logit_scale.detach().cpu(),
            "rank_values": self.rank_values.detach().cpu(),
        }
        if self.encoder_builder is not None:
            payload["encoder_builder"] = self.encoder_builder
            payload["encoder_state_dict"] = {k: v.detach().cpu() for k, v in self.image_encoder.state_dict().items()}
        else:
            payload["encoder_module"] = self.image_encoder
        torch.save(payload, path)

    @classmethod
    def load(
        cls, path: str | Any, map_location: str | torch.device = "cpu", allow_pickle: bool = True
    ) -> PrototypeClassifier:
        """Load a file written by :meth:`save`; the classifier is returned in eval mode.

        Args:
            path: file path.
            map_location: passed to ``torch.load``.
            allow_pickle: allow files that pickle the image encoder (written without
                ``encoder_builder``); unpickling runs code, so only for trusted files.
        """
        try:
            payload = torch.load(path, map_location=map_location, weights_only=True)
        except pickle.UnpicklingError as exc:
            if not allow_pickle:
                raise ValueError(
                    f"{path} stores a pickled image encoder; load it with allow_pickle=True if you trust the file, "
                    "or re-export with an encoder_builder"
                ) from exc
            payload = torch.load(path, map_location=map_location, weights_only=False)
        if not isinstance(payload, dict) or payload.get("format") != _FORMAT:
            raise ValueError(f"{path} is not a PrototypeClassifier export (written by PrototypeClassifier.save)")
        if payload.get("version", 0) > _FORMAT_VERSION:
            raise ValueError(
                f"{path} has format version {payload['version']} > {_FORMAT_VERSION}; upgrade cloc-lightning"
            )
        builder = payload.get("encoder_builder")
        if builder is not None:
            if builder["name"] not in ENCODER_BUILDERS:
                raise ValueError(
                    f"{path} needs the encoder builder {builder['name']!r}, which is not registered; import the "
                    f"module that registers it (registered: {sorted(ENCODER_BUILDERS)})"
                )
            encoder = ENCODER_BUILDERS[builder["name"]](**builder["kwargs"])
            encoder.load_state_dict(payload["encoder_state_dict"])
        else:
            encoder = payload["encoder_module"]
        clf = cls(encoder, payload["prototypes"], payload["logit_scale"], payload["rank_values"], builder)
        with torch.no_grad():  # stored already normalised: keep the exact bits (no second normalisation)
            clf.prototypes.copy_(payload["prototypes"])
        return clf.to(map_location).eval()


def logits_to_predictions(
    logits: Tensor,
    rank_values: Tensor | None = None,
    kind: Literal["expectation", "argmax"] = "expectation",
) -> Tensor:
    """Rank predictions from ``[N, R]`` logits.

    Args:
        logits: ``[N, R]``.
        rank_values: ``[R]`` value of each rank, default ``arange(R)``.
        kind: ``"expectation"`` (``sum_r softmax_r * value_r``) or ``"argmax"`` (``value[argmax]``).

    Returns:
        ``[N]`` float32 predictions.
    """
    logits = logits.float()
    if rank_values is None:
        rank_values = torch.arange(logits.shape[-1], dtype=torch.float32, device=logits.device)
    rank_values = rank_values.to(device=logits.device, dtype=torch.float32)
    if kind == "expectation":
        return torch.softmax(logits, dim=-1) @ rank_values
    if kind == "argmax":
        return rank_values[logits.argmax(dim=-1)]
    raise ValueError(f"kind must be 'expectation' or 'argmax', got {kind!r}")

