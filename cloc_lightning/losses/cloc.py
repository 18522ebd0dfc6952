"""CLOC: the multi-margin ordinal contrastive (N-pair) loss.

Paper: D. Pitawela, G. Carneiro, H.-T. Chen, "CLOC: Contrastive Learning for
Ordinal Classification with Multi-Margin N-pair Loss", CVPR 2025
(arXiv:2504.17813).  Reference code: ``dpitawela/CLOC`` ``loss.py`` (the
authors' ``OrdinalContrastiveLoss_mm`` / ``OrdinalContrastiveLoss_sm``).  The
public interface below is the reference's, so a training loop written for the
CLOC README runs unchanged.

The loss (numerically equal to the reference)
---------------------------------------------
For a batch of predictions ``x`` ([N, D]) with integer labels ``y`` ([N]):

* ``s_ij = cos(x_i, x_j)``;  positives ``P_i = {j != i : y_j = y_i}``,
  negatives ``N_i = {k : y_k != y_i}``.
* adjacent margins ``m_c = softplus(raw_c)`` (``c = 0 .. C-2``), class positions
  ``pos = cumsum([0, m_0, ..., m_{C-2}])`` and the margin between classes ``a``
  and ``b`` is ``|pos_a - pos_b|`` (the single-margin variant repeats one margin).
* per anchor ``l_i = sum_{j in P_i} sum_{k in N_i} relu(s_ik - s_ij + m(y_i, y_k)) / w_i``
  with ``w_i = |P_i| * |N_i|**2`` (``reduction='official'``: the reference
  divides by ``|N_i|`` twice, once per positive column and once in its final
  mean) or ``w_i = |P_i| * |N_i|`` (``reduction='mean'``: the mean over
  (positive, negative) pairs).  Anchors with an empty ``P_i`` or ``N_i`` give 0
  and still count in the mean ``L = mean_i l_i``.

How it is computed (exact, ``O(N^2 log N)``, no Python loop over the batch)
--------------------------------------------------------------------------
For anchor ``i`` put ``a_k = s_ik + m(y_i, y_k)`` at the negatives and ``b_j = s_ij``
at the positives; since a same-class margin is 0, that is simply the row
``s_i + m(y_i, .)``.  Sort the row (at equal values negatives first, so a tie never
counts, i.e. ``relu'(0) = 0`` as in ``torch.relu``).  Every pair ``b_j < a_k``
spans the gaps between consecutive sorted values, so

    ``sum_{j,k} relu(a_k - b_j) = sum_q (v_{q+1} - v_q) * #{b at or below q} * #{a above q}``,

two cumulative counts and one product per row: ``O(N^2 log N)`` in total (the
sort), against the reference's ``O(N^3)``.  All terms are non-negative, so
float32 loses nothing to cancellation.  The gradient is analytic (a custom
:class:`torch.autograd.Function`): ``d/da_k = #{j : b_j < a_k}`` and
``d/db_j = -#{k : a_k > b_j}``, read off the same counts and scattered back to
the original columns; backward keeps one ``[N, N]`` coefficient matrix and no
per-pair tensor is ever built.  On CPU the row sort packs value and column into
int64 keys and uses NumPy's vectorised sort (several times faster than
``torch.sort``, which always materialises an index array); elsewhere two stable
``torch.sort`` calls give the same order.  Rows are processed in blocks that
bound the temporaries.

Differences to the reference code (deliberate)
----------------------------------------------
* fixed margins are registered buffers (in ``state_dict``, follow ``.to()`` and
  dtype; float32 by default instead of float64), ``device`` is optional;
* ``OrdinalContrastiveLoss_sm`` works without a ``SummaryWriter`` and registers
  the same "Class Distances" layout (one curve, ``Margin``);
* scalars are logged only when both a writer and a ``step`` are given;
* inputs are validated (labels, shapes, ``learnable_map``, non-finite values);
* the similarity part runs in float32 even under bf16/fp16 autocast;
* optional ``gather_distributed`` (local anchors against the global batch);
* the version of the reference with a label-distance threshold ``d`` for
  positives is not supported (its default ``d = 0`` is what is implemented).

The margins (parse, validate, freeze, log, YAML) live in
:mod:`cloc_lightning.losses.cloc_margins`; each loss is its margins' owner.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from cloc_lightning import distributed as dist_utils
from cloc_lightning.checks import require
from cloc_lightning.losses.base import Loss
from cloc_lightning.losses.cloc_margins import CLOCMargins, MultiMargins, SingleMargin
from cloc_lightning.validation import check_bool, check_choice, check_tensor

__all__ = [
    "OrdinalContrastiveLoss_mm",
    "OrdinalContrastiveLoss_sm",
    "cloc_pair_hinge_sums",
]

Reduction = Literal["official", "mean"]
#: ``eps`` of :func:`torch.nn.functional.cosine_similarity` (the reference's similarity).
_COS_EPS = 1e-8


# ----------------------------------------------------------------------------
# the O(N^2 log N) core
# ----------------------------------------------------------------------------
#: rows of the [rows, M] problem sorted at once (bounds the temporaries to a few arrays of
#: this many elements, about 32 MiB each as int64).
_BLOCK_ELEMENTS = 2**22
_LOW31 = (1 << 31) - 1
_FLAG = 1 << 31


def _argsort_rows_packed(vals: torch.Tensor, flag: torch.Tensor) -> torch.Tensor:
    """Row-wise argsort of a CPU float32 matrix by (value, flag, column) via one int64 value sort.

    Each entry becomes the key ``(order-preserving int32 of the value) << 32 | flag << 31 |
    column``; sorting the keys (NumPy's in-place SIMD sort; ``torch.sort`` on CPU is several
    times slower) yields the columns in that order.  Exact: the key carries all 32 bits of
    the value.  Returns int64 indices.
    """
    n_cols = vals.shape[1]
    keys = (vals + 0.0).view(torch.int32).to(torch.int64)  # "+ 0.0" turns -0.0 into +0.0
    flip = keys >> 31  # -1 for negative floats, 0 otherwise
    keys ^= flip.bitwise_and_(_LOW31)  # now monotone in the float value
    cols = torch.arange(n_cols, dtype=torch.int64)
    low = torch.where(flag, cols + _FLAG, cols)
    keys.bitwise_left_shift_(32).bitwise_or_(low)
    keys.numpy().sort(axis=1)  # in place
    return keys.bitwise_and_(_LOW31)


def _argsort_rows(vals: torch.Tensor, flag: torch.Tensor) -> torch.Tensor:
    """Row-wise argsort of ``vals`` [r, M]; equal values: ``flag == False`` first, then by column."""
    if vals.device.type == "cpu" and vals.dtype == torch.float32 and vals.shape[1] <= _LOW31:
        return _argsort_rows_packed(vals.contiguous(), flag)
    first = torch.sort(flag.to(torch.uint8), dim=1, stable=True).indices  # unflagged columns first
    by_value = torch.sort(vals.gather(1, first), dim=1, stable=True).indices
    return first.gather(1, by_value)


def _hinge_block(merged: torch.Tensor, is_pos: torch.Tensor, n_neg: torch.Tensor, coef: torch.Tensor) -> torch.Tensor:
    """Hinge sums of a block of rows; writes their gradient coefficients into ``coef``.

    ``merged`` [r, M] holds ``a_k = s_ik + m(y_i, y_k)`` at the negatives and ``b_j = s_ij`` at
    the positives (``is_pos``; the margin of a same-class pair is 0) and a finite sentinel
    above every value at the anchor's own column (flagged positive, so it pairs with nothing).
    ``n_neg`` [r] counts the negatives.  Returns ``S`` [r] with
    ``S = sum_{j in P, k in N} relu(a_k - b_j)`` and fills ``coef`` [r, M] with
    ``dS/da_k = #{j : b_j < a_k}`` and ``dS/db_j = -#{k : a_k > b_j}`` (ties count 0).

    With the row sorted (``v_1 <= v_2 <= ...``, at ties negatives first, so a tie never
    counts) every pair ``b_j < a_k`` spans the gaps between them, hence
    ``S = sum_q (v_{q+1} - v_q) * #{b at or below q} * #{a above q}``: a sum of non-negative
    terms (no cancellation; float32 is accurate at any batch size).  Counts are exact in
    float32 up to 2**24.
    """
    n_cols = merged.shape[1]
    idx = _argsort_rows(merged, is_pos)
    sorted_vals = merged.gather(1, idx)
    is_b = is_pos.gather(1, idx)
    b_upto = torch.cumsum(is_b, dim=1, dtype=merged.dtype)  # #{b at or below q}; at an a_k: #{b_j < a_k}
    # -(#{a above q}) = #{a at or below q} - |N|
    minus_a_above = torch.arange(1, n_cols + 1, device=merged.device, dtype=merged.dtype) - b_upto
    minus_a_above -= n_neg.to(merged.dtype).unsqueeze(1)
    weight = b_upto[:, :-1] * minus_a_above[:, :-1]  # -(pairs spanning gap q)
    gaps = sorted_vals[:, :-1] - sorted_vals[:, 1:]  # <= 0
    sums = gaps.mul_(weight).sum(1)
    # coefficient in sorted order: b_upto at an a_k, minus_a_above at a b_j
    coef_sorted = minus_a_above.sub_(b_upto).mul_(is_b).add_(b_upto)
    coef.scatter_(1, idx, coef_sorted)
    return sums


class _PairHingeSums(torch.autograd.Function):
    """``S_i = sum_{j in P_i} sum_{k in N_i} relu(s_ik + D[y_i, y_k] - s_ij)`` for every row ``i``.

    Inputs: ``s`` [n, M] similarities of the anchors (rows) to the batch (columns),
    ``dmat`` [C, C] class-distance matrix (zero diagonal), ``y_row`` [n], ``y_col`` [M],
    ``self_col`` [n] (each anchor's own column), ``n_neg`` [n].  Returns ``S`` [n].  Forward
    keeps only the gradient coefficients ([n, M]); gradients flow to ``s`` and ``dmat``.
    """

    @staticmethod
    def forward(
        ctx: Any,
        s: torch.Tensor,
        dmat: torch.Tensor,
        y_row: torch.Tensor,
        y_col: torch.Tensor,
        self_col: torch.Tensor,
        n_neg: torch.Tensor,
    ) -> torch.Tensor:
        n, m = s.shape
        rows = torch.arange(n, device=s.device)
        big = torch.finfo(s.dtype).max / 16  # finite sentinel above every similarity + margin
        merged = dmat.index_select(0, y_row).index_select(1, y_col).add_(s)  # same class: + 0 exactly
        merged[rows, self_col] = big
        is_pos = y_row.unsqueeze(1) == y_col.unsqueeze(0)
        block = max(1, _BLOCK_ELEMENTS // m)
        sums = torch.empty(n, dtype=s.dtype, device=s.device)
        coef = torch.empty_like(merged)
        for r0 in range(0, n, block):  # row blocks bound the temporaries; not a loop over samples
            r1 = r0 + block
            sums[r0:r1] = _hinge_block(merged[r0:r1], is_pos[r0:r1], n_neg[r0:r1], coef[r0:r1])
        del merged
        ctx.save_for_backward(coef, is_pos, y_row, y_col)
        ctx.n_classes = dmat.shape[0]
        return sums

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        coef, is_pos, y_row, y_col = ctx.saved_tensors
        n, m = coef.shape
        grad_s = coef * grad.to(coef.dtype).unsqueeze(1)
        grad_dmat = None
        if ctx.needs_input_grad[1]:
            at_neg = grad_s.masked_fill(is_pos, 0.0)  # the margins enter at the negatives only
            per_class = grad_s.new_zeros(n, ctx.n_classes).scatter_add_(1, y_col.unsqueeze(0).expand(n, m), at_neg)
            grad_dmat = grad_s.new_zeros(ctx.n_classes, ctx.n_classes).index_add_(0, y_row, per_class)
        return grad_s, grad_dmat, None, None, None, None


def cloc_pair_hinge_sums(
    s: torch.Tensor,
    dmat: torch.Tensor,
    y_row: torch.Tensor,
    y_col: torch.Tensor,
    self_col: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-anchor hinge sums of CLOC and the positive/negative counts.

    Args:
        s: [n, M] similarities of ``n`` anchors to ``M`` batch members (float32/64).
        dmat: [C, C] margins between classes (``|pos_a - pos_b|``, zero diagonal), dtype of ``s``.
        y_row: [n] anchor labels (int64, in ``[0, C)``).
        y_col: [M] batch labels (int64, in ``[0, C)``).
        self_col: [n] column of each anchor itself (excluded from its positives).

    Returns:
        ``(S, n_pos, n_neg)``, each [n]: ``S_i = sum_{j in P_i, k in N_i} relu(s_ik + dmat[y_i, y_k] - s_ij)``
        (differentiable wrt ``s`` and ``dmat``; ``relu'(0) = 0``), ``|P_i|`` and ``|N_i|`` (no grad).
    """
    # per-class counts without torch.bincount (which reads the device to size its output)
    counts = torch.zeros(dmat.shape[0], dtype=torch.int64, device=y_col.device).index_add_(0, y_col, torch.ones_like(y_col))[y_row]
    n_neg = y_col.shape[0] - counts
    sums = _PairHingeSums.apply(s, dmat, y_row, y_col, self_col, n_neg)
    return sums, (counts - 1).to(s.dtype), n_neg.to(s.dtype)


# ----------------------------------------------------------------------------
# the modules
# ----------------------------------------------------------------------------
class _OrdinalContrastiveLossBase(CLOCMargins, Loss):
    """Shared machinery of :class:`OrdinalContrastiveLoss_mm` and :class:`OrdinalContrastiveLoss_sm`.

    The loss is its margins' owner (:class:`~cloc_lightning.losses.cloc_margins.CLOCMargins`:
    parse, validate, freeze, log, YAML); a subclass also inherits the margins' layout
    (:class:`~cloc_lightning.losses.cloc_margins.MultiMargins` or
    :class:`~cloc_lightning.losses.cloc_margins.SingleMargin`).  This class adds the loss.
    """

    def __init__(
        self,
        n_classes: int,
        device: torch.device | str | None = None,
        learnable_map: Sequence[Sequence[Any]] | None = None,
        summaryWriter: Any = None,  # the reference's public name
        *,
        reduction: Reduction = "official",
        gather_distributed: bool = False,
        check_finite: bool = True,
    ) -> None:
        super().__init__(n_classes, learnable_map)  # the margins: parsed, validated, built (the layout's order)
        self.reduction: Reduction = check_choice(
            "reduction",
            reduction,
            Reduction,
            hint="'official' divides by |P|*|N|^2 as the CLOC code, 'mean' by |P|*|N|",
        )
        self.gather_distributed = check_bool("gather_distributed", gather_distributed)
        self.check_finite = check_bool("check_finite", check_finite)
        if device is not None:
            self.to(device)
        self.set_writer(summaryWriter)

    # -- the loss ----------------------------------------------------------
    def _check_inputs(self, prediction: Any, target: Any) -> None:
        check_tensor("prediction", prediction, floating=True, non_empty=True, layout="[batch, dim]")
        check_tensor(
            "prediction", prediction, dim=2, layout="[batch, dim]", hint="logits or features; flatten them with prediction.flatten(1)"
        )
        check_tensor("target", target, floating=False, layout="[batch]", holding="class ids")
        if target.dim() != 1 or target.shape[0] != prediction.shape[0]:
            raise ValueError(
                f"target must be [batch] = [{prediction.shape[0]}] to match prediction, got shape "
                f"{tuple(target.shape)}; use target.view(-1)"
            )
        if target.device != prediction.device:
            raise ValueError(f"target is on {target.device} but prediction on {prediction.device}; move both to one device")

    def _validate_values(self, x: torch.Tensor, y: torch.Tensor, margins: torch.Tensor) -> torch.Tensor:
        """Value checks (label range, finite inputs and margins) through :func:`cloc_lightning.checks.require`.

        Outside a Trainer's training step: one host sync per check, raised at once.  Inside:
        recorded on the device and read every ``log_every_n_steps``.  Returns the labels
        clamped into ``[0, n_classes)``, so that a deferred out-of-range label cannot index
        out of bounds before the check is read.
        """
        in_range = (y >= 0) & (y < self.n_classes)
        require(
            in_range,
            f"labels must lie in [0, n_classes) = [0, {self.n_classes}); check n_classes or remap the labels to 0..{self.n_classes - 1}",
            detail=lambda: f" (got values in [{int(y.min())}, {int(y.max())}])",
        )
        require(
            torch.isfinite(margins),
            "the CLOC margins are not finite (training diverged?): lower the learning rate of the margins or use gradient clipping",
        )
        if self.check_finite:
            require(
                torch.isfinite(x),
                "prediction contains NaN or inf (training diverged?): lower the learning rate, use gradient "
                "clipping or check the inputs (check_finite=False skips this check)",
            )
        return y.clamp(0, self.n_classes - 1)

    def forward(self, prediction: torch.Tensor, target: torch.Tensor, step: int | None = None) -> torch.Tensor:
        """CLOC loss of a batch.

        Args:
            prediction: [N, D] logits or features (any float dtype; computed in float32,
                or float64 when the input or the margins are float64).
            target: [N] integer labels in ``[0, n_classes)``.
            step: global step for TensorBoard logging (only used with a ``summaryWriter``).

        Returns:
            Scalar loss (0-d tensor; with ``gather_distributed`` this rank's share, see
            :func:`cloc_lightning.distributed.global_mean`).
        """
        self._check_inputs(prediction, target)
        raw = self.raw_margins()
        if raw.device != prediction.device:
            raise ValueError(
                f"the margins are on {raw.device} but prediction on {prediction.device}; "
                f"move the loss with .to(device) (or pass device=...)"
            )
        dtype = torch.promote_types(torch.promote_types(prediction.dtype, torch.float32), raw.dtype)
        with torch.autocast(device_type=prediction.device.type, enabled=False):
            x = prediction.to(dtype)
            y = target.long()
            margins = F.softplus(raw.to(dtype))
            x = x / torch.linalg.vector_norm(x, dim=1, keepdim=True).clamp_min(_COS_EPS)
            n_local = x.shape[0]
            if self.gather_distributed and dist_utils.is_distributed():
                x_all = dist_utils.gather(x)
                y_all = dist_utils.gather_no_grad(y)
                offset = dist_utils.local_offset(n_local, x.device)
                # checked on the gathered batch, so every rank raises and none hangs
                y_all = self._validate_values(x_all, y_all, margins)
                y = y.clamp(0, self.n_classes - 1)
            else:
                x_all, y_all, offset = x, y, 0
                y = y_all = self._validate_values(x, y, margins)
            pos = torch.cat([margins.new_zeros(1), torch.cumsum(margins, 0)])
            dmat = (pos.unsqueeze(0) - pos.unsqueeze(1)).abs()
            s = x @ x_all.t()
            self_col = torch.arange(offset, offset + n_local, device=x.device)
            sums, n_pos, n_neg = cloc_pair_hinge_sums(s, dmat, y, y_all, self_col)
            denom = n_pos * n_neg * n_neg if self.reduction == "official" else n_pos * n_neg
            per_anchor = sums / denom.clamp_min(1.0)
            loss = dist_utils.global_mean(per_anchor) if self.gather_distributed else per_anchor.mean()
        self.write_scalars(step)
        return loss

    def extra_repr(self) -> str:
        return (
            f"n_classes={self.n_classes}, reduction={self.reduction!r}, "
            f"gather_distributed={self.gather_distributed}, check_finite={self.check_finite}"
        )


class OrdinalContrastiveLoss_mm(_OrdinalContrastiveLossBase, MultiMargins):  # the reference's public name
    """CLOC with multiple margins: one learnable or fixed margin between each pair of adjacent classes.

    Pitawela, Carneiro, Chen, "CLOC: Contrastive Learning for Ordinal Classification with
    Multi-Margin N-pair Loss", CVPR 2025 (arXiv:2504.17813); reference code
    ``dpitawela/CLOC`` (``loss.py``).  See the module docstring for the formula.

    Args:
        n_classes: number of ordinal classes ``C >= 2``.
        device: optional device to create the margins on (``.to(device)`` works too).
        learnable_map: ``None`` (every margin learnable, initialised from U(0.5, 1.0)) or
            ``C - 1`` pairs ``[kind, value]``: ``['learnable', v]`` starts at margin ``v``
            (``None``: U(0.5, 1.0)), ``['fixed', v]`` keeps margin ``v``.  ``v`` is the margin
            itself; its inverse softplus is stored.
        summaryWriter: optional ``SummaryWriter``; with ``step`` given to :meth:`forward`
            the margins are logged as ``C{i}-C{i+1}`` (plus a "Class Distances" layout).
        reduction: ``'official'`` divides each anchor's sum by ``|P|*|N|**2`` (the CLOC
            code; default so published numbers reproduce), ``'mean'`` by ``|P|*|N|``.
        gather_distributed: compute local anchors against the batch gathered from all
            ranks (with gradients); the returned value is this rank's share of the global mean.
        check_finite: raise a ``ValueError`` on NaN/inf predictions (one cheap check).

    Attributes:
        learnables: ``nn.Parameter`` [n_learnable] with the raw (pre-softplus) learnable
            margins (``F.softplus(crit.learnables)`` as in the CLOC README); empty and
            frozen when every margin is fixed.
        fixed_raw: buffer [C - 1], raw values of the fixed margins (0 at learnable slots).
        learnable_mask: bool buffer [C - 1]; ``learnable_index``: long buffer [n_learnable].

    Shapes:
        ``prediction`` [N, D], ``target`` [N] -> scalar.

    Example::

        >>> import torch
        >>> crit = OrdinalContrastiveLoss_mm(n_classes=5, learnable_map=[
        ...     ['fixed', 0.12], ['learnable', None], ['fixed', 0.40], ['learnable', 0.32]])
        >>> logits = torch.randn(8, 5, requires_grad=True)
        >>> labels = torch.tensor([0, 1, 2, 3, 4, 0, 1, 2])
        >>> loss = crit(logits, labels)
        >>> loss.backward()
        >>> crit.learnables.shape, crit.margins().shape
        (torch.Size([2]), torch.Size([4]))
        >>> phase_two_map = crit.to_learnable_map('fixed')  # [['fixed', 0.12], ...]
    """


class OrdinalContrastiveLoss_sm(_OrdinalContrastiveLossBase, SingleMargin):  # the reference's public name
    """CLOC with a single margin shared by every pair of adjacent classes.

    Same loss as :class:`OrdinalContrastiveLoss_mm` (Pitawela et al., CVPR 2025; reference
    ``dpitawela/CLOC``) with all ``C - 1`` adjacent margins equal to ``softplus(distance)``.

    Args:
        n_classes: number of ordinal classes ``C >= 2``.
        device: optional device to create the margin on.
        learnable_map: ``None`` (learnable, U(0.5, 1.0)) or one pair: ``[['learnable', v]]``
            (``v`` or ``None``) or ``[['fixed', v]]``; ``v`` is the margin itself.
        summaryWriter: optional ``SummaryWriter``; logs ``Margin`` when ``step`` is given
            (works without a writer, unlike the reference).
        reduction: as in :class:`OrdinalContrastiveLoss_mm`.
        gather_distributed: as in :class:`OrdinalContrastiveLoss_mm`.
        check_finite: as in :class:`OrdinalContrastiveLoss_mm`.

    Attributes:
        distance: raw margin [1]; an ``nn.Parameter`` when learnable, a buffer when fixed
            (``F.softplus(crit.distance)`` works either way).

    Shapes:
        ``prediction`` [N, D], ``target`` [N] -> scalar.

    Example::

        >>> import torch
        >>> crit = OrdinalContrastiveLoss_sm(n_classes=5, learnable_map=[['learnable', 0.47]])
        >>> loss = crit(torch.randn(6, 5), torch.tensor([0, 1, 1, 2, 3, 4]))
        >>> round(float(torch.nn.functional.softplus(crit.distance.detach())), 2)
        0.47
    """
