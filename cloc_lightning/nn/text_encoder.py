"""CLIP's frozen text transformer, fed token *embeddings* instead of token ids.

:class:`FrozenTextEncoder` keeps the parts of an open_clip text tower that run after the
token-embedding lookup (transformer, final LayerNorm, text projection, positional
embeddings), so that learned prompt embeddings can be fed in; the prompt learner
(:mod:`cloc_lightning.nn.prompt_learner`) builds those embeddings.  The tokenizer helpers
here read open_clip's CLIP BPE tokenizer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["FrozenTextEncoder", "text_tower", "clip_embed_dim", "default_tokenizer", "bpe_ids"]


def text_tower(clip_model: nn.Module) -> tuple[Any, str]:
    """The object holding open_clip's text-transformer parts, and its pool type.

    The object is the model itself (``open_clip.CLIP``) or its ``text`` tower
    (``CustomTextCLIP``); it has ``token_embedding``, ``positional_embedding``, ``transformer``,
    ``ln_final``, ``text_projection`` (and ``attn_mask``), read by duck typing.
    """
    src: Any
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


def clip_embed_dim(clip_model: nn.Module) -> int:
    """CLIP's joint embedding width D (the text projection's output width), shared by both towers."""
    proj = getattr(clip_model, "text_projection", None)
    if isinstance(proj, Tensor) and proj.dim() == 2:
        return int(proj.shape[1])
    if isinstance(proj, nn.Linear):
        return int(proj.out_features)
    text = getattr(clip_model, "text", None)
    if text is not None and getattr(text, "output_dim", None):
        return int(text.output_dim)
    raise ValueError(f"cannot find the embedding width of {type(clip_model).__name__}; use an open_clip CLIP model")


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

    transformer: nn.Module
    ln_final: nn.Module
    positional_embedding: Tensor
    #: ``[W, D]`` matrix, an ``nn.Linear``, or ``None`` (features of width W)
    text_projection: Tensor | nn.Linear | None
    attn_mask: Tensor | None
    special_embeddings: Tensor

    def __init__(self, clip_model: nn.Module, special_token_ids: Sequence[int]) -> None:
        super().__init__()
        src, _ = text_tower(clip_model)
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
        dtype: torch.dtype = get() if callable(get) else self.positional_embedding.dtype
        return dtype

    def train(self, mode: bool = True) -> FrozenTextEncoder:  # frozen: always eval
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
        pooled: Tensor = self.ln_final(x[rows, eot_index])  # LayerNorm is per token: pooling first is identical
        proj = self.text_projection
        if proj is None:
            return pooled
        if isinstance(proj, nn.Linear):
            projected: Tensor = proj(pooled)
            return projected
        return pooled @ proj


def default_tokenizer(context_length: int) -> Any:
    """open_clip's CLIP BPE tokenizer (``SimpleTokenizer``) for ``context_length`` positions."""
    from open_clip.tokenizer import SimpleTokenizer

    return SimpleTokenizer(context_length=context_length)


def bpe_ids(tokenizer: Any, text: str) -> list[int]:
    """BPE ids of ``text`` without SOT/EOT."""
    enc = getattr(tokenizer, "encode", None)
    if enc is None or not hasattr(tokenizer, "sot_token_id"):
        raise TypeError(
            f"tokenizer {type(tokenizer).__name__} is not open_clip's CLIP BPE tokenizer (needs encode(), "
            "sot_token_id, eot_token_id); pass open_clip.get_tokenizer(<CLIP model>) or leave tokenizer=None."
        )
    return [int(t) for t in enc(text)]
