"""Supervised contrastive loss (SupCon) with SimCLR's NT-Xent as its label-free case.

Paper: P. Khosla et al., "Supervised Contrastive Learning", NeurIPS 2020
(arXiv:2004.11362), eq. 2 (``L_out``).  Without labels the loss is the NT-Xent
loss of T. Chen et al., "A Simple Framework for Contrastive Learning of Visual
Representations" (SimCLR), ICML 2020 (arXiv:2002.05709).

Reference code: ``HobbitLong/SupContrast`` ``losses.py`` (the authors' code),
including the fix of its PR #142 for anchors without positives.  Its defaults are
ours (``temperature=0.07``, ``base_temperature=0.07``); the remaining differences
are documented on :class:`SupConLoss`.

How it is computed (no ``[N, N]`` masks are ever built):

* The loss of anchor ``a`` is ``(T / T_b) * (LSE_a - mean_{p in P(a)} s_ap / T)``
  with ``LSE_a = log sum_{k != a} exp(s_ak / T)``: the log-denominator does not
  depend on the positive, so the mean over positives only needs the mean
  positive logit.  Because ``s_ap`` is a dot product, the sum over positives is
  ``z_a . (sum of the contrast vectors of a's class) - z_a . z_a``: class sums
  are ``O(N * dim)`` (``index_add``), and autograd differentiates them cheaply.
* Only ``LSE`` touches the ``[N_anchor, N_contrast]`` similarity matrix.  It is a
  custom :class:`torch.autograd.Function` with the analytic gradient
  ``d LSE_a / d s_ak = softmax_k / T``.  The *dense* variant keeps one
  ``[N_a, N_c]`` matrix (the un-normalised softmax) for backward; the *tiled*
  variant walks row blocks, stores only ``LSE`` per row and recomputes each
  block's softmax in backward, so its memory is ``O(N_c * block)``.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
from torch.autograd.function import once_differentiable

from cloc_lightning import distributed as dist_utils
from cloc_lightning.checks import require
from cloc_lightning.losses.base import Loss
from cloc_lightning.validation import check_choice, check_float, check_int, check_tensor

__all__ = [
    "SupConLoss",
    "supcon_loss",
    "DEFAULT_BASE_TEMPERATURE",
    "AUTO_DENSE_MAX_ELEMENTS",
    "AUTO_TILE_ELEMENTS",
]

TileSize = int | None | Literal["auto"]
#: ``'all'``: every view is an anchor; ``'one'``: only view 0 (SupContrast's ``contrast_mode``)
ContrastMode = Literal["all", "one"]

#: SupContrast's ``base_temperature`` (``losses.py``): the loss is multiplied by
#: ``temperature / base_temperature``, and this stays 0.07 whatever the temperature.
DEFAULT_BASE_TEMPERATURE: float = 0.07

#: ``tile_size='auto'`` uses the dense path while the similarity matrix has at
#: most this many entries (``N_anchor * N_contrast``; 2**25 float32 = 128 MiB,
#: e.g. batch 2048 x 2 views = 4096 x 4096 = 2**24 is dense) and the tiled path above.
AUTO_DENSE_MAX_ELEMENTS: int = 2**25
#: Tiled path under ``'auto'``: rows per block = ``AUTO_TILE_ELEMENTS // N_contrast``
#: (at least 32), i.e. about 16 MiB of float32 per block.
AUTO_TILE_ELEMENTS: int = 2**22

_FLOATS_KEPT = (torch.float32, torch.float64)
_NONFINITE_MESSAGE = (
    "SupConLoss: features contain NaN or inf. Training has most likely diverged: lower the learning "
    "rate, use gradient clipping, or use bf16 instead of fp16; check the inputs for NaN. "
    "(Pass check_finite=False to skip this check.)"
)


# ----------------------------------------------------------------------------
# log-sum-exp over the contrast set, excluding each anchor's own entry
# ----------------------------------------------------------------------------
def _mask_self(z: torch.Tensor, self_idx: torch.Tensor) -> None:
    """Set ``z[r, self_idx[r]] = -inf`` in place (``z``: contiguous [rows, N_c], ``self_idx``: [rows])."""
    flat = torch.arange(z.shape[0], device=z.device) * z.shape[1] + self_idx
    z.view(-1).index_fill_(0, flat, -math.inf)


def _self_excluded_exp_(z: torch.Tensor, self_idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``z <- exp(z - rowmax)`` in place with each row's own entry masked (:func:`_mask_self`); ``(rowmax, rowsum)`` [rows, 1].

    The row's log-sum-exp is ``rowmax + log(rowsum)``.
    """
    _mask_self(z, self_idx)
    row_max = z.amax(dim=1, keepdim=True)
    z.sub_(row_max).exp_()
    return row_max, z.sum(dim=1, keepdim=True)


class _DenseLSE(torch.autograd.Function):
    """``LSE_a = logsumexp_{k != self(a)} <anchors_a, contrast_k> * inv_t`` in one block.

    Keeps ``E = exp(z - rowmax)`` ([N_a, N_c]) and the row sums for backward, where
    ``dA = (g * inv_t / sum) * (E @ C)`` and ``dC = E^T @ ((g * inv_t / sum) * A)``.
    """

    @staticmethod
    def forward(ctx: Any, anchors: torch.Tensor, contrast: torch.Tensor, self_idx: torch.Tensor, inv_t: float) -> torch.Tensor:
        z = torch.mm(anchors * inv_t, contrast.t())
        row_max, row_sum = _self_excluded_exp_(z, self_idx)
        lse = (row_max + row_sum.log()).squeeze(1)
        ctx.save_for_backward(anchors, contrast, z, row_sum)
        ctx.inv_t = inv_t
        return lse

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_lse: torch.Tensor) -> tuple[Any, ...]:
        anchors, contrast, e, row_sum = ctx.saved_tensors
        with torch.autocast(device_type=e.device.type, enabled=False):
            w = grad_lse.to(e.dtype).unsqueeze(1) * ctx.inv_t / row_sum  # [N_a, 1]
            grad_a = torch.mm(e, contrast).mul_(w) if ctx.needs_input_grad[0] else None
            grad_c = torch.mm(e.t(), anchors * w) if ctx.needs_input_grad[1] else None
        return grad_a, grad_c, None, None


class _TiledLSE(torch.autograd.Function):
    """Same value and gradient as :class:`_DenseLSE`, computed ``block`` anchor rows at a time.

    Forward stores only ``LSE`` ([N_a]); backward recomputes each block's softmax
    ``P = exp(z - LSE)`` and accumulates ``dA`` (per block) and ``dC`` (over blocks).
    Peak extra memory is one ``[block, N_c]`` buffer.
    """

    @staticmethod
    def forward(ctx: Any, anchors: torch.Tensor, contrast: torch.Tensor, self_idx: torch.Tensor, inv_t: float, block: int) -> torch.Tensor:
        n_a = anchors.shape[0]
        scaled = anchors * inv_t
        ct = contrast.t()
        lse = anchors.new_empty(n_a)
        buf = anchors.new_empty(min(block, n_a), contrast.shape[0])
        for start in range(0, n_a, block):
            stop = min(start + block, n_a)
            z = torch.mm(scaled[start:stop], ct, out=buf[: stop - start])
            row_max, row_sum = _self_excluded_exp_(z, self_idx[start:stop])
            lse[start:stop] = (row_max + row_sum.log()).squeeze(1)
        ctx.save_for_backward(anchors, contrast, self_idx, lse)
        ctx.inv_t = inv_t
        ctx.block = block
        return lse

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_lse: torch.Tensor) -> tuple[Any, ...]:
        anchors, contrast, self_idx, lse = ctx.saved_tensors
        inv_t, block = ctx.inv_t, ctx.block
        need_a, need_c = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        n_a = anchors.shape[0]
        with torch.autocast(device_type=anchors.device.type, enabled=False):
            w = grad_lse.to(anchors.dtype).unsqueeze(1) * inv_t  # [N_a, 1]
            scaled = anchors * inv_t
            ct = contrast.t()
            grad_a = torch.empty_like(anchors) if need_a else None
            grad_c = torch.zeros_like(contrast) if need_c else None
            buf = anchors.new_empty(min(block, n_a), contrast.shape[0])
            for start in range(0, n_a, block):
                stop = min(start + block, n_a)
                p = torch.mm(scaled[start:stop], ct, out=buf[: stop - start])
                _mask_self(p, self_idx[start:stop])
                p.sub_(lse[start:stop].unsqueeze(1)).exp_()  # softmax over k != self
                if grad_a is not None:
                    torch.mm(p, contrast, out=grad_a[start:stop]).mul_(w[start:stop])
                if grad_c is not None:
                    grad_c.addmm_(p.t(), anchors[start:stop] * w[start:stop])
        return grad_a, grad_c, None, None, None


def _choose_tile(tile_size: TileSize, n_anchor: int, n_contrast: int) -> int | None:
    """Rows per block for the tiled path, or ``None`` for the dense path."""
    if tile_size is None:
        return None
    if tile_size == "auto":
        if n_anchor * n_contrast <= AUTO_DENSE_MAX_ELEMENTS:
            return None
        return max(32, AUTO_TILE_ELEMENTS // n_contrast)
    return int(tile_size)


def _self_excluded_lse(
    anchors: torch.Tensor, contrast: torch.Tensor, self_idx: torch.Tensor, inv_t: float, tile: int | None
) -> torch.Tensor:
    """``[N_a]`` log-sum-exp of ``anchors @ contrast.T * inv_t`` per row, skipping ``self_idx``."""
    lse: torch.Tensor = (
        _DenseLSE.apply(anchors, contrast, self_idx, inv_t) if tile is None else _TiledLSE.apply(anchors, contrast, self_idx, inv_t, tile)
    )
    return lse


# ----------------------------------------------------------------------------
# validation
# ----------------------------------------------------------------------------
def _check_temperature(name: str, value: Any) -> float:
    return check_float(name, value, minimum=0.0, strict_minimum=True, expect="a positive finite float (e.g. 0.07)")


def _check_hparams(
    temperature: Any, contrast_mode: Any, base_temperature: Any, tile_size: Any
) -> tuple[float, ContrastMode, float, TileSize]:
    t = _check_temperature("temperature", temperature)
    mode = check_choice("contrast_mode", contrast_mode, ContrastMode, hint="'all': every view is an anchor, 'one': only view 0")
    base_t = t if base_temperature is None else _check_temperature("base_temperature", base_temperature)
    if tile_size is not None and tile_size != "auto":
        check_int("tile_size", tile_size, 1, hint="rows per block; or None (dense) or 'auto'")
    return t, mode, base_t, tile_size


def _check_inputs(features: Any, labels: Any, mask: Any, gather_distributed: bool) -> None:
    check_tensor("features", features, floating=True, non_empty=True, layout="[bsz, n_views, dim]")
    hint = (
        "for a single view use features.unsqueeze(1); for several views torch.stack([v1, v2], dim=1)"
        if features.dim() == 2
        else "flatten the trailing dims with features.flatten(2)"
    )
    check_tensor("features", features, dim=3, layout="[bsz, n_views, dim]", hint=hint)
    bsz = features.shape[0]
    if labels is not None and mask is not None:
        raise ValueError("pass either labels (supervised) or mask (explicit positives), not both")
    if labels is not None:
        check_tensor("labels", labels, floating=False, layout="[bsz]", holding="class ids")
        check_tensor("labels", labels, dim=1, layout="[bsz]", hint="use labels.view(-1)")
        if labels.shape[0] != bsz:
            raise ValueError(
                f"labels has {labels.shape[0]} entries but features has batch size {bsz}: one label per sample (not per view) is expected"
            )
    if mask is not None:
        if gather_distributed:
            raise ValueError(
                "an explicit mask relates local samples only and cannot be combined with gather_distributed=True; "
                "pass labels instead, or set gather_distributed=False"
            )
        check_tensor("mask", mask, layout="[bsz, bsz]")
        if tuple(mask.shape) != (bsz, bsz):
            raise ValueError(f"mask must be [bsz, bsz] = [{bsz}, {bsz}], got shape {tuple(mask.shape)}")
        if mask.is_complex():
            raise TypeError(f"mask must be bool or real-valued, got dtype {mask.dtype}")
        if mask.dtype != torch.bool:
            m = mask.double()
            require(torch.isfinite(m).all() & (m >= 0).all(), "mask entries must be finite and >= 0 (1 = positive pair, 0 = not)")


# ----------------------------------------------------------------------------
# the loss
# ----------------------------------------------------------------------------
def _group_ids(labels: torch.Tensor) -> torch.Tensor:
    """Dense group ids of ``labels`` [B]: ``0..G-1`` in the order of the sorted distinct labels.

    The ids ``torch.unique(labels, return_inverse=True)`` gives, computed on the device
    without reading how many groups there are (no host sync): sort, mark where the sorted
    value changes, cumulative sum, scatter back.
    """
    sorted_labels, order = torch.sort(labels, stable=True)
    starts = torch.ones_like(sorted_labels, dtype=torch.int64)
    starts[1:] = (sorted_labels[1:] != sorted_labels[:-1]).to(torch.int64)
    return torch.empty_like(order).scatter_(0, order, starts.cumsum(0) - 1)


def _positive_terms(
    features: torch.Tensor,
    gathered: torch.Tensor,
    anchors: torch.Tensor,
    anchor_sample: torch.Tensor,
    offset: int,
    labels: torch.Tensor | None,
    mask: torch.Tensor | None,
    distributed: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum of positive similarities and number (weight) of positives per anchor, both [N_a].

    ``features``: local [b, V, dim]; ``gathered``: global [B, V, dim] (``features`` on one
    process); ``anchors``: [N_a, dim]; ``anchor_sample``: local sample index of every anchor.
    The anchor's own entry is never a positive.
    """
    n_views = features.shape[1]
    self_dot = (anchors * anchors).sum(1)
    if mask is not None:
        m = mask.to(device=features.device, dtype=features.dtype)
        sample_sum = features.sum(1)  # [b, dim]: sum over views
        pos_vec = (m @ sample_sum)[anchor_sample]
        diag = m.diagonal()[anchor_sample]
        pos_dot = (anchors * pos_vec).sum(1) - diag * self_dot
        n_pos = n_views * m.sum(1)[anchor_sample] - diag
        return pos_dot, n_pos
    sample_sum = gathered.sum(1)  # [B, dim]
    global_sample = anchor_sample + offset
    if labels is None:  # SimCLR: positives are the other views of the same image
        pos_vec = sample_sum[global_sample]
        n_pos = torch.full_like(self_dot, n_views - 1)
    else:
        all_labels = dist_utils.gather_no_grad(labels) if distributed else labels
        group = _group_ids(all_labels)
        n_groups = group.shape[0]  # an upper bound (every sample its own class); empty groups are never read
        dim = sample_sum.shape[1]
        # class sums as a 1-D index_add (the 2-D CPU kernel is very slow with several threads)
        flat_idx = (group.unsqueeze(1) * dim + torch.arange(dim, device=group.device)).reshape(-1)
        group_sum = sample_sum.new_zeros(n_groups * dim).index_add(0, flat_idx, sample_sum.reshape(-1))
        group_sum = group_sum.view(n_groups, dim)
        group_count = sample_sum.new_zeros(n_groups).index_add_(0, group, sample_sum.new_ones(group.shape[0])) * n_views
        anchor_group = group[global_sample]
        pos_vec = group_sum[anchor_group]
        n_pos = group_count[anchor_group] - 1
    pos_dot = (anchors * pos_vec).sum(1) - self_dot
    return pos_dot, n_pos


def supcon_loss(
    features: torch.Tensor,
    labels: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    *,
    temperature: float = 0.07,
    contrast_mode: ContrastMode = "all",
    base_temperature: float | None = DEFAULT_BASE_TEMPERATURE,
    gather_distributed: bool = False,
    tile_size: TileSize = "auto",
    check_finite: bool = True,
) -> torch.Tensor:
    """Functional form of :class:`SupConLoss` (same arguments, same result).

    Args:
        features: [bsz, n_views, dim], L2-normalised by the caller; any float dtype
            (computed in float32, or float64 if given float64).
        labels: [bsz] integer class ids, or ``None``.
        mask: [bsz, bsz] bool/float, ``mask[i, j] > 0`` if sample ``j`` is a positive of
            anchor sample ``i`` (float values act as weights, may be asymmetric), or ``None``.

    Returns:
        Scalar loss (float32, or float64 for float64 features).
    """
    t, mode, base_t, tile_size = _check_hparams(temperature, contrast_mode, base_temperature, tile_size)
    _check_inputs(features, labels, mask, gather_distributed)
    with torch.autocast(device_type=features.device.type, enabled=False):
        return _supcon(features, labels, mask, t, mode, base_t, gather_distributed, tile_size, check_finite)


def _supcon(
    features: torch.Tensor,
    labels: torch.Tensor | None,
    mask: torch.Tensor | None,
    temperature: float,
    contrast_mode: ContrastMode,
    base_temperature: float,
    gather_distributed: bool,
    tile_size: TileSize,
    check_finite: bool,
) -> torch.Tensor:
    f = features if features.dtype in _FLOATS_KEPT else features.float()
    bsz, n_views, dim = f.shape
    device = f.device
    if labels is not None:
        labels = labels.to(device)

    distributed = gather_distributed and dist_utils.is_distributed()
    if distributed:
        gathered = dist_utils.gather(f)  # [B, V, dim], gradients flow back to every rank
        offset = dist_utils.local_offset(bsz, device)
    else:
        gathered, offset = f, 0
    if check_finite:
        # checked on the gathered batch so that every rank raises, none hangs; recorded on the device
        # inside a Trainer's training step (cloc_lightning.checks), read at once elsewhere
        require(torch.isfinite(gathered), _NONFINITE_MESSAGE)
    n_global = gathered.shape[0]
    # contrast set: view-major, entry v * B + j is view v of global sample j (as the reference)
    contrast = gathered.transpose(0, 1).reshape(n_views * n_global, dim)
    n_contrast = contrast.shape[0]
    local_idx = torch.arange(bsz, device=device)
    if contrast_mode == "all":
        anchors = f.transpose(0, 1).reshape(n_views * bsz, dim) if distributed else contrast
        anchor_sample = local_idx.repeat(n_views)
        view_idx = torch.arange(n_views, device=device).repeat_interleave(bsz)
        self_idx = view_idx * n_global + offset + anchor_sample
    else:
        anchors = f[:, 0] if distributed else contrast[:bsz]
        anchor_sample = local_idx
        self_idx = offset + local_idx

    if n_contrast < 2:  # a single entry in the whole batch: nothing to contrast with
        return f.sum() * 0.0

    pos_dot, n_pos = _positive_terms(f, gathered, anchors, anchor_sample, offset, labels, mask, distributed)
    has_pos = n_pos > 0
    safe_n_pos = torch.where(has_pos, n_pos, torch.ones_like(n_pos))
    tile = _choose_tile(tile_size, anchors.shape[0], n_contrast)
    lse = _self_excluded_lse(anchors, contrast, self_idx, 1.0 / temperature, tile)
    mean_pos_logit = pos_dot / (safe_n_pos * temperature)
    per_anchor = torch.where(has_pos, (temperature / base_temperature) * (lse - mean_pos_logit), torch.zeros_like(lse))
    if gather_distributed:
        return dist_utils.global_mean(per_anchor)
    return per_anchor.mean()


class SupConLoss(Loss):
    r"""Supervised contrastive loss ``L_out`` (Khosla et al. 2020, eq. 2); SimCLR without labels.

    For ``features`` of shape [bsz, n_views, dim] the contrast set holds all
    ``N = bsz * n_views`` views.  With ``contrast_mode='all'`` every view is an
    anchor, with ``'one'`` only view 0 of each sample.  For anchor ``a`` with
    positives ``P(a)`` (same label, or ``mask[i, j] > 0``, or -- without labels and
    mask -- the other views of the same image; never ``a`` itself):

    .. math::
        \ell_a = -\frac{T}{T_b}\,\frac{1}{|P(a)|}\sum_{p\in P(a)}
                 \log\frac{\exp(z_a\cdot z_p/T)}{\sum_{k\neq a}\exp(z_a\cdot z_k/T)},
        \qquad L = \frac{1}{N_{anchor}}\sum_a \ell_a .

    * **Anchors without positives** (e.g. a class seen once with ``n_views=1``)
      contribute ``\ell_a = 0`` and still count in ``N_anchor``: the mean is over
      *all* anchors, exactly as SupContrast after its PR #142 (pytorch-metric-learning's
      ``AvgNonZeroReducer`` instead averages over non-zero losses only).  A batch in
      which no anchor has a positive gives loss 0 with zero gradients, never NaN.
    * **base_temperature** ``T_b`` (default 0.07, as SupContrast): the loss is
      multiplied by ``T / T_b``, so at ``T = 0.1`` it is 1.43x and at ``T = 0.5``
      (SimCLR) 7.1x the plain loss -- with SGD this acts like a larger learning rate.
      ``base_temperature=None`` ties ``T_b`` to ``T`` (factor 1: the plain loss of the
      paper's eq. 2, and pytorch-metric-learning's ``SupConLoss``).  At ``T = 0.07``
      both are the same.
    * A float ``mask`` acts as weights: the mean over positives becomes
      ``sum_p w_ap log_prob / sum_p w_ap``, as in the reference.
    * Computed in float32 (float64 inputs stay float64) with autocast disabled, so bf16
      inputs at ``T = 0.05`` stay finite; the log-sum-exp is max-subtracted.
    * ``tile_size``: ``None`` = dense (one ``[N_anchor, N]`` float matrix kept for
      backward, fastest); an int = row blocks of that many anchors, the forward
      keeps only the per-row log-sum-exp and backward recomputes each block's
      softmax (memory ``O(N * tile)``); ``'auto'`` = dense while
      ``N_anchor * N <= AUTO_DENSE_MAX_ELEMENTS`` (2**25, e.g. dense at batch
      2048 x 2 views, tiled from about 2900 x 2 views up), else tiles of
      ``max(32, 2**22 // N)`` rows.  Both give the same values and gradients.
    * ``gather_distributed=True``: local anchors against the global contrast set
      (features all-gathered *with* gradients via :func:`cloc_lightning.distributed.gather`,
      labels via ``gather_no_grad``) and the reduction
      :func:`~cloc_lightning.distributed.global_mean`, so the mean of the rank losses
      equals the single-process loss on the concatenated batch and DDP's averaged
      gradients equal single-process gradients.  Ranks may hold different batch
      sizes.  An explicit ``mask`` cannot be combined with it (ValueError).  On one
      process it changes nothing.
    * Not twice differentiable (the log-sum-exp backward is analytic).

    Reference code: https://github.com/HobbitLong/SupContrast (``losses.py``, PR #142),
    with the same defaults.  Differences: features must be exactly 3-D (the reference
    flattens trailing dimensions); no ``[N, N]`` masks are built.

    Args:
        temperature: ``T`` > 0 (the paper's 0.07 for SupCon; SimCLR often 0.1-0.5).
            A fixed hyper-parameter (a float, not a buffer): modules store it with
            their hyper-parameters.
        contrast_mode: ``'all'`` or ``'one'``.
        base_temperature: ``T_b`` > 0 (default 0.07, SupContrast's), or ``None`` = tied
            to ``temperature`` (no rescaling).
        gather_distributed: gather the contrast set over all ranks (see above).
        tile_size: ``'auto'``, ``None`` (dense) or rows per block (int >= 1).
        check_finite: raise a ValueError on NaN/inf features (one ``isfinite`` pass; inside a
            Trainer's training step recorded on the device and read every ``log_every_n_steps``,
            see :mod:`cloc_lightning.checks`).

    Shapes:
        ``features`` [bsz, n_views, dim]; ``labels`` [bsz] (int) or ``mask``
        [bsz, bsz] (bool/float) or neither; returns a scalar.

    Example::

        >>> import torch, torch.nn.functional as F
        >>> loss_fn = SupConLoss(temperature=0.1)
        >>> feats = F.normalize(torch.randn(8, 2, 128), dim=-1)   # 8 images, 2 views
        >>> labels = torch.randint(0, 3, (8,))
        >>> supervised = loss_fn(feats, labels)                   # SupCon
        >>> simclr = loss_fn(feats)                               # SimCLR / NT-Xent
        >>> bool(torch.isfinite(supervised)) and bool(torch.isfinite(simclr))
        True
    """

    def __init__(
        self,
        temperature: float = 0.07,
        contrast_mode: ContrastMode = "all",
        base_temperature: float | None = DEFAULT_BASE_TEMPERATURE,
        *,
        gather_distributed: bool = False,
        tile_size: TileSize = "auto",
        check_finite: bool = True,
    ) -> None:
        super().__init__()
        t, mode, _, tile = _check_hparams(temperature, contrast_mode, base_temperature, tile_size)
        self.temperature = t
        self.contrast_mode = mode
        self.base_temperature = None if base_temperature is None else float(base_temperature)
        self.gather_distributed = bool(gather_distributed)
        self.tile_size = tile
        self.check_finite = bool(check_finite)

    def forward(self, features: torch.Tensor, labels: torch.Tensor | None = None, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Loss of ``features`` [bsz, n_views, dim] with ``labels`` [bsz] or ``mask`` [bsz, bsz] (or neither)."""
        return supcon_loss(
            features,
            labels,
            mask,
            temperature=self.temperature,
            contrast_mode=self.contrast_mode,
            base_temperature=self.base_temperature,
            gather_distributed=self.gather_distributed,
            tile_size=self.tile_size,
            check_finite=self.check_finite,
        )

    def extra_repr(self) -> str:
        return (
            f"temperature={self.temperature}, contrast_mode={self.contrast_mode!r}, "
            f"base_temperature={self.base_temperature}, gather_distributed={self.gather_distributed}, "
            f"tile_size={self.tile_size!r}"
        )
