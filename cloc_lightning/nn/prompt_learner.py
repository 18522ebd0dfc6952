"""OrdinalCLIP's rank prompt learner: learned context and rank embeddings, interpolated ranks.

OrdinalCLIP (Li, Huang, Zhu, Tang, Li, Zhou, Lu, "OrdinalCLIP: Learning Rank Prompts for
Language-Guided Ordinal Regression", NeurIPS 2022, arXiv 2206.02338; reference code
https://github.com/xk-huang/OrdinalCLIP, ``ordinalclip/models/prompt_leaners/``) turns ordinal
regression into image–text matching: every rank ``r`` gets a prompt

    [SOT] context_1 … context_N [rank_r,1 … rank_r,T] . [EOT] [pad] …

whose CLIP text feature is the rank's *language prototype*. The context tokens and the rank
embeddings are learned, the text encoder is frozen
(:class:`~cloc_lightning.nn.text_encoder.FrozenTextEncoder`). The rank embeddings of all R ranks
are linear interpolations of B ≤ R learnable *base* rank embeddings
(:func:`rank_interpolation_weights`), which builds the order of the ranks into the prompts (the
paper's "learnable rank embeddings" with interpolation).

The prototype heads live in :mod:`cloc_lightning.nn.prototypes`, the exported
:class:`~cloc_lightning.nn.prototype_classifier.PrototypeClassifier` in :mod:`cloc_lightning.nn.prototype_classifier`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch
from torch import Tensor, nn

from cloc_lightning.nn.text_encoder import FrozenTextEncoder, bpe_ids, default_tokenizer, text_tower
from cloc_lightning.validation import check_choice, check_int, choices

__all__ = [
    "InterpolationKind",
    "RankPosition",
    "INTERPOLATION_KINDS",
    "RANK_POSITIONS",
    "rank_interpolation_weights",
    "RankPromptLearner",
]

#: how the R rank embeddings are interpolated from the B base ones (:func:`rank_interpolation_weights`)
InterpolationKind = Literal["linear", "inv_prop", "normal"]
#: where the rank tokens go in the prompt (:class:`RankPromptLearner`)
RankPosition = Literal["tail", "front", "middle"]
INTERPOLATION_KINDS: tuple[str, ...] = choices(InterpolationKind)
RANK_POSITIONS: tuple[str, ...] = choices(RankPosition)


def _check_ranks(num_ranks: Any, num_base_ranks: Any) -> None:
    """R >= 2 ranks from 1 <= B <= R base ranks."""
    check_int("num_ranks", num_ranks, 2, hint="an ordinal problem needs at least two ranks")
    check_int(
        "num_base_ranks",
        num_base_ranks,
        1,
        maximum=num_ranks,
        expect=f"an int in [1, num_ranks={num_ranks}]",
        hint="the base rank embeddings are interpolated to all ranks; the reference uses a few (e.g. 3)",
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
    reference to ~1e-6. Test: ``tests/fidelity/test_fidelity_ordinal_clip.py``.

    Args:
        num_ranks: R >= 2.
        num_base_ranks: B with 1 <= B <= R.
        kind: ``"linear"``, ``"inv_prop"`` or ``"normal"``.
        dtype: dtype of the returned tensor.

    Returns:
        ``[R, B]`` tensor, non-negative, rows summing to 1.
    """
    _check_ranks(num_ranks, num_base_ranks)
    check_choice("interpolation", kind, InterpolationKind)
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
        check_int("num_tokens_per_rank", num_tokens_per_rank, 1)
        check_int("num_context_tokens", num_context_tokens, 0)
        check_choice("interpolation", interpolation, InterpolationKind)
        check_choice("rank_position", rank_position, RankPosition)
        src, _ = text_tower(clip_model)
        context_length = int(src.positional_embedding.shape[0])
        if tokenizer is None:
            tokenizer = default_tokenizer(context_length)
        bpe_ids(tokenizer, "")  # type check
        sot, eot = int(tokenizer.sot_token_id), int(tokenizer.eot_token_id)
        period = bpe_ids(tokenizer, ".")
        if len(period) != 1:
            raise ValueError(f"the tokenizer encodes '.' as {period}, expected one token")
        pad = 0  # open_clip's CLIP tokenizer pads with id 0
        token_table: Tensor = src.token_embedding.weight
        width = int(token_table.shape[1])

        def lookup(ids: list[int]) -> Tensor:
            with torch.no_grad():
                idx = torch.as_tensor(ids, dtype=torch.long, device=token_table.device)
                return token_table[idx].detach().float().cpu().clone()

        # context
        if init_context is not None:
            if not isinstance(init_context, str) or not init_context.strip():
                raise ValueError(f"init_context must be a non-empty string or None, got {init_context!r}")
            ctx_ids = bpe_ids(tokenizer, init_context.replace("_", " "))
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
            name_ids = [bpe_ids(tokenizer, str(n).replace("_", " ")) for n in names]
            empty = [n for n, ids in zip(names, name_ids, strict=True) if not ids]
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
            hooks: Any = self  # torch's hook-registration methods carry no type hints
            if hasattr(self, "register_state_dict_post_hook"):  # public since torch 2.4
                hooks.register_state_dict_post_hook(_drop_text_encoder_keys)
            else:  # pragma: no cover - older torch
                hooks._register_state_dict_hook(_drop_text_encoder_keys)
            if hasattr(self, "register_load_state_dict_pre_hook"):  # public since torch 2.4
                hooks.register_load_state_dict_pre_hook(_fill_text_encoder_keys)
            else:  # pragma: no cover - older torch
                hooks._register_load_state_dict_pre_hook(_fill_text_encoder_keys, with_module=True)

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
                idx = [round((num_ranks - 1) / 2)]
            else:
                idx = [round(p) for p in torch.linspace(0, num_ranks - 1, num_base_ranks).tolist()]
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
        sot, period, eot = (special[i].expand(R, 1, W) for i in range(3))
        ctx: Tensor = self.context_embeds
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
            parts.append(special[3].expand(R, n_pad, W))  # pad
        return torch.cat(parts, dim=1)

    def forward(self) -> Tensor:
        """Language prototypes of all ranks.

        Returns:
            ``[R, D]`` text features (not normalised), in the text encoder's dtype.
        """
        length = self.eot_index + 1 if (self.truncate_padding and self.text_encoder.causal) else None
        features: Tensor = self.text_encoder(self.prompt_embeddings(length), self.eot_index)
        return features

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
    for key, value in module.get_submodule("text_encoder").state_dict().items():
        state_dict.setdefault(own + key, value)
