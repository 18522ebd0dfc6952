"""Sigmoid contrastive loss with a confidence penalty and a KL invariance term (ReLIC + SigLIP).

The loss of "Sigmoid Contrastive Loss for Vision" (F. Basara, 2024;
https://github.com/filipbasara0/sigmoid-contrastive-loss, package
``sigmoid-contrastive-learning``, function ``scl_loss``): the pairwise sigmoid loss of
SigLIP (X. Zhai, B. Mustafa, A. Kolesnikov, L. Beyer, "Sigmoid Loss for Language Image
Pre-Training", ICCV 2023, arXiv:2303.15343) with a focal-style confidence penalty, plus
the KL invariance regulariser of ReLIC (J. Mitrovic et al., "Representation Learning via
Invariant Causal Mechanisms", ICLR 2021, arXiv:2010.07922).  Same signature and
semantics as the seed's ``scl_loss``, so code ports unchanged.

Definition (``n`` rows; the online ``x`` and target ``x'`` are L2-normalised *inside*
the loss, as the seed does)::

    s      = clamp(exp(tau), 0, max_tau)                  # logit scale
    L      = s * x_n @ x'_n.T + b                         # [n, n] logits
    y      = 2 I - 1                                      # +1 on the diagonal (positives), -1 elsewhere
    pen    = (1 - sigmoid(y * L)) ** gamma                # confidence penalty, NOT detached
    loss_s = -sum(pen * logsigmoid(y * L)) / n
    KL     = kl_div(log_softmax(L, dim=1), softmax(L, dim=0).T, reduction="batchmean")
           = (1/n) sum_i sum_j T_ij (log T_ij - log P_ij)
    loss   = loss_s + alpha * KL

``P = softmax(L, dim=1)``: row ``i`` is online ``x_i`` over all targets (the *input* of
``kl_div``).  The **target distribution** of the KL is ``T = softmax(L, dim=0).T =
softmax(L.T, dim=1)``: row ``i`` is target ``x'_i`` over all online rows (column ``i`` of
``L`` softmaxed).  Gradients flow through both ``P`` and ``T`` (nothing is detached, as in
the seed).  The returned ``invariance_loss`` is ``KL`` itself, differentiable, whatever
``alpha`` is.  ``b`` cancels in the KL (its gradient from the KL is zero).

Penalty filtering (``penalty_filtering=True`` and ``global_step >
filtering_warmup_steps``, as the seed: steps ``0 .. filtering_warmup_steps`` use the
weighted loss above, filtering starts at step ``filtering_warmup_steps + 1``): the
penalty only *selects* the pairs -- every positive is kept, a negative only if its
penalty ``pen_ij > filtering_threshold`` -- and the kept pairs enter the sum
**without** the penalty weight::

    keep   = (pen > filtering_threshold) | I          # a constant mask (no gradient)
    loss_s = -sum(keep * logsigmoid(y * L)) / n       # still divided by n

(the seed's ``-sum(logsigmoid(selected_labels * selected_logits)) / n``), so at
``gamma = 1`` the filtered loss is roughly twice the weighted one.  With ``gamma = 0``
every penalty is 1, so nothing is dropped unless ``filtering_threshold >= 1``.

How it is computed
------------------
A custom :class:`torch.autograd.Function` with the analytic gradient, row block by row
block (row ``i``'s terms depend only on row ``i`` of ``L`` and row ``i`` of ``L.T``):

* labels are never built: ``u = -y * L`` is ``L`` with its ``n`` positive entries negated,
  and every term is ``f(u) = sigmoid(u)**gamma * softplus(u)`` (``softplus(u) =
  -logsigmoid(y * L)``, ``sigmoid(u) = 1 - sigmoid(y * L)``), with
  ``f'(u) = sigmoid(u)**gamma * (gamma * sigmoid(-u) * softplus(u) + sigmoid(u))``;
  ``gamma = 0`` skips the power and ``gamma = 1`` uses ``sigmoid(u)`` itself;
* the KL uses the rows of ``L`` and of ``L.T`` with
  ``dKL_i/dL_ij = P_ij - T_ij`` and ``dKL_i/d(L.T)_ij = T_ij (log T_ij - log P_ij - KL_i)``;
  it is invariant to ``b`` and runs on ``L - b``, whose entries are bounded by the scale
  (unit rows), so the soft-max shift needs no max pass while ``2 s`` stays below 80;
* one process: ``L.T`` is a transposed copy of ``L``, and the ``L.T`` gradient is merged
  into the ``L`` gradient (one more transposed copy), so forward+backward is three
  matrix products like SigLIP's; under ``gather_distributed`` the rows of ``L.T`` (local
  targets against the global online batch) are a second product and backward takes four;
* the gradient matrices are formed in forward -- only when an input needs a gradient --
  in the buffers that held the logits (one ``[n, N]`` matrix is kept for backward, two
  under DDP with ``alpha > 0``), the rest is cache-sized per-block scratch; backward is
  matrix products and sums only; on CPU these matrices are reused from call to call
  (:mod:`cloc_lightning.losses._workspace`: no page faults).  Differentiating the returned ``invariance_loss``
  itself recomputes the KL gradient matrices in backward;
* ``softplus`` on CPU is ``relu(u) + log1p(exp(-|u|))`` with ``log1p(e)`` evaluated as
  ``log(w) + (e - (w - 1)) / w``, ``w = 1 + e`` (the rounding error of ``w`` corrected;
  accurate to a few ulp, the same value as ``-F.logsigmoid(-u)``), built from vectorised
  ``exp``/``log``: on the project's CPUs ``F.logsigmoid``/``F.softplus``/``log1p`` run
  scalar code and are ~10x slower than ``exp``.  Other devices use ``F.softplus`` (one
  fused kernel).
* Everything runs in float32 (float64 if ``x`` or ``x'`` is float64) with autocast
  disabled, so bf16/fp16 inputs under mixed precision stay finite.  The returned losses
  are float32 (float64); gradients reach the inputs in their own dtype.  Not twice
  differentiable.

Distributed (``gather_distributed=True``; nothing changes on one process): the local rows
``x`` are scored against the global ``x'`` (gathered *with* gradients through
:func:`cloc_lightning.distributed.gather`); the positive of local row ``i`` is global
column ``offset + i`` (:func:`~cloc_lightning.distributed.local_offset`); the KL target
rows ``T_i`` use the global ``x``, gathered the same way.  The sums over local rows are
scaled by ``W / N`` (:func:`~cloc_lightning.distributed.global_mean`'s convention), so the
mean of the rank losses equals the single-process loss on the concatenated batch and DDP's
averaged gradients equal the single-process gradients (``tau`` and ``b`` included).  Ranks
may hold different batch sizes.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from cloc_lightning import distributed as dist_utils
from cloc_lightning.losses._workspace import work_matrix
from cloc_lightning.losses.base import Loss, LossOutput
from cloc_lightning.validation import check_float, check_int, check_tensor

__all__ = ["sigmoid_contrastive_loss", "SigmoidContrastiveLoss", "BLOCK_ELEMENTS"]

#: CPU row blocks hold ``max(1, BLOCK_ELEMENTS * threads // N)`` rows of ``N`` columns (64 Ki
#: elements, 256 KiB of float32 per scratch buffer and intra-op thread), so a block's
#: element-wise chain stays in cache.  Other devices process the whole matrix at once.
BLOCK_ELEMENTS: int = 2**16

Scalar = float | int | torch.Tensor

#: what each number is, in its error messages
_HINTS = {
    "alpha": "the weight of the KL invariance term; 0 = off",
    "gamma": "the confidence-penalty exponent; 0 = plain SigLIP",
    "max_tau": "the upper clamp of exp(tau), e.g. 5.0",
    "filtering_threshold": "penalties lie in [0, 1]",
}


# ----------------------------------------------------------------------------
# element-wise pieces (in place on caller-provided buffers)
# ----------------------------------------------------------------------------
def _softplus(u: torch.Tensor, out: torch.Tensor, tmp: torch.Tensor) -> torch.Tensor:
    """``out <- softplus(u) = log(1 + exp(u))`` for any ``u`` (``tmp``: scratch of ``u``'s shape)."""
    if u.device.type != "cpu":
        return out.copy_(F.softplus(u))
    e = torch.abs(u, out=tmp).neg_().exp_()  # e = exp(-|u|) in (0, 1]
    w = torch.add(e, 1.0, out=out)  # w = fl(1 + e) in [1, 2]
    w.sub_(1.0)  # w - 1, exact
    e.sub_(w)  # e - (w - 1): the rounding error of 1 + e, exact
    w.add_(1.0)  # back to w, exact
    e.div_(w)
    w.log_().add_(e)  # log1p(e) = log(w) + (e - (w - 1)) / w
    return w.add_(torch.clamp_min(u, 0.0, out=tmp))


def _exp_rows_(z: torch.Tensor, out: torch.Tensor, shift: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``out <- exp(z - m)`` with ``m`` = ``shift`` (a bound on every entry) or the row max.

    Returns ``(lse, row_sum)``: the row log-sum-exp and the row sums of ``out`` (both [rows]).
    """
    if shift is None:
        m = z.amax(dim=1)
        e = torch.sub(z, m.unsqueeze(1), out=out).exp_()
    else:
        m = z.new_full((z.shape[0],), shift)
        e = torch.sub(z, shift, out=out).exp_()
    tot = e.sum(dim=1)
    return m + tot.log(), tot


def _kl_block(lb: torch.Tensor, mb: torch.Tensor, p: torch.Tensor, t: torch.Tensor, store: bool, shift: float | None) -> torch.Tensor:
    """KL rows of one block; ``lb`` = rows of ``L``, ``mb`` = the same rows of ``L.T`` (both ``[k, N]``).

    ``p``/``t`` are scratch.  Returns ``KL_i`` ([k]).  ``mb`` is overwritten: with ``store``
    it holds ``dKL_i/d(L.T)_ij = T_ij (log T_ij - log P_ij - KL_i)`` and ``p`` holds
    ``-dKL_i/dL_ij = T_ij - P_ij``.
    """
    r, r_sum = _exp_rows_(lb, p, shift)  # exp(L - m): P unnormalised
    c, c_sum = _exp_rows_(mb, t, shift)  # exp(L.T - m): T unnormalised
    t.div_(c_sum.unsqueeze(1))  # T
    mb.sub_(lb).mul_(t)  # T * (L.T - L) = T * (log T - log P + c - r)
    kl = mb.sum(dim=1).add_(r).sub_(c)
    if store:
        mb.addcmul_(t, (r - c - kl).unsqueeze(1))  # T * (log T - log P - KL)
        torch.addcmul(t, p, r_sum.reciprocal().unsqueeze(1), value=-1.0, out=p)  # T - P
    return kl


def _neg_entries_(z: torch.Tensor, flat_idx: torch.Tensor) -> None:
    """Negate ``z.view(-1)[flat_idx]`` in place (``z`` contiguous)."""
    zf = z.view(-1)
    zf.index_copy_(0, flat_idx, zf.index_select(0, flat_idx).neg_())


# ----------------------------------------------------------------------------
# the fused loss
# ----------------------------------------------------------------------------
def _row_block(n_cols: int, device: torch.device, n_rows: int) -> int:
    """Rows per block: all rows off CPU; on CPU ``BLOCK_ELEMENTS`` elements per intra-op thread."""
    if device.type != "cpu":
        return max(1, n_rows)
    return max(1, min(n_rows, BLOCK_ELEMENTS * torch.get_num_threads() // max(1, n_cols)))


def _exp_shift(s: torch.Tensor) -> float | None:
    """``s``, an upper bound of every ``L - b`` (unit rows: ``|cos| <= 1``), when subtracting it is safe.

    Every ``exp(L - b - s) >= exp(-2 s)`` must stay a normal number (float32: ``2 s <= 80``);
    else ``None`` (shift each row by its max).  Saves a max pass per row block on CPU.
    """
    if s.device.type != "cpu":
        return None
    scale = float(s)
    limit = 80.0 if s.dtype != torch.float64 else 600.0
    return scale if 2.0 * scale <= limit else None


def _logits(rows: torch.Tensor, cols: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """``s * rows @ cols.T`` (the logits without the bias) in a contiguous work matrix (:mod:`._workspace`)."""
    return torch.mm(rows * s, cols.t(), out=work_matrix(rows.shape[0], cols.shape[0], rows))


def _transposed_logits(gl: torch.Tensor, xp_rows: torch.Tensor, x_cols: torch.Tensor, s: torch.Tensor, square: bool) -> torch.Tensor:
    """Rows of ``L.T - b`` for the local rows: a transposed copy of ``gl`` on one process, else a product."""
    return work_matrix(gl.shape[1], gl.shape[0], gl).copy_(gl.t()) if square else _logits(xp_rows, x_cols, s)


class _SigmoidContrastive(torch.autograd.Function):
    """``(sum_i loss_i, sum_i KL_i)`` over the local rows; see the module docstring.

    Inputs: ``x`` [n, d] local online rows, ``xp_cols`` [N, d] targets they are scored
    against (global under DDP), ``xp_rows`` [n, d] local targets, ``x_cols`` [N, d] online
    rows the KL target distribution runs over (global under DDP), scale ``s`` and bias
    ``b`` (0-d), the column ``offset`` of row 0's positive, and ``square``: the inputs are
    one process' batch (``xp_cols is xp_rows``, ``x_cols is x``), so ``L.T`` is a transposed
    copy of ``L`` and the two gradient matrices are merged into one.
    ``loss_i = sum_j f(u_ij) + alpha * KL_i``.
    """

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        xp_cols: torch.Tensor,
        xp_rows: torch.Tensor,
        x_cols: torch.Tensor,
        s: torch.Tensor,
        b: torch.Tensor,
        offset: int,
        gamma: float,
        threshold: float | None,
        alpha: float,
        square: bool,
        with_kl: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        ctx.set_materialize_grads(False)
        need = any(ctx.needs_input_grad[:6])
        store_kl = need and alpha > 0
        n, n_cols = x.shape[0], xp_cols.shape[0]
        # the KL is invariant to b: it runs on L - b; b is added to each block for the sigmoid part
        gl = _logits(x, xp_cols, s)  # L - b, becomes dloss/dL
        # rows of L.T - b, become dKL/d(L.T); not built when the KL is not wanted (alpha = 0)
        gm = _transposed_logits(gl, xp_rows, x_cols, s, square) if with_kl else None
        shift = _exp_shift(s)
        rows = _row_block(n_cols, x.device, n)
        n_blocks = -(-n // rows)
        loss_parts = x.new_empty(n_blocks)
        kl_parts = x.new_zeros(n_blocks)
        general = gamma not in (0.0, 1.0) or threshold is not None
        buf = [work_matrix(rows, n_cols, x) for _ in range(4 if general else 3)]
        ar = torch.arange(rows, device=x.device)
        for blk, i0 in enumerate(range(0, n, rows)):
            k = min(rows, n - i0)
            lb = gl[i0 : i0 + k]
            p, t, a = buf[0][:k], buf[1][:k], buf[2][:k]
            if gm is not None:
                kl_parts[blk] = _kl_block(lb, gm[i0 : i0 + k], p, t, store_kl, shift).sum()
            lb.add_(b)
            # positives of these rows sit in column offset + i: u = L with them negated
            flat = ar[:k] * (n_cols + 1) + (offset + i0)
            _neg_entries_(lb, flat)
            sp = _softplus(lb, out=a, tmp=t)  # -logsigmoid(y L)
            if not general and gamma == 0.0:
                loss_parts[blk] = sp.sum()
                if need:
                    lb.sigmoid_()  # f'(u) = sigmoid(u)
            else:
                sg = torch.sigmoid(lb, out=t)  # 1 - sigmoid(y L)
                if gamma == 1.0:
                    pen = sg
                elif gamma == 0.0:
                    pen = buf[3][:k].fill_(1.0)
                else:
                    pen = torch.pow(sg, gamma, out=buf[3][:k])
                if threshold is not None:
                    # filtering (the seed): the penalty only selects the pairs; kept pairs enter UNWEIGHTED,
                    # f(u) = keep * softplus(u), f'(u) = keep * sigmoid(u)
                    keep = pen > threshold
                    keep.view(-1)[flat] = True
                    w = buf[3][:k].copy_(keep)  # (may overwrite pen: keep already holds what is needed)
                    loss_parts[blk] = torch.dot(w.view(-1), sp.view(-1))
                    if need:
                        torch.mul(sg, w, out=lb)
                else:
                    loss_parts[blk] = torch.dot(pen.view(-1), sp.view(-1))
                    if need:
                        om = lb.neg_().sigmoid_()  # sigmoid(-u)
                        torch.addcmul(sg, om, sp, value=gamma, out=om).mul_(pen)
            if need:
                _neg_entries_(lb, flat)  # dL = -f'(u) at the positives
                if store_kl:
                    lb.sub_(p, alpha=alpha)  # + alpha * (P - T)
        del buf
        ctx.square, ctx.alpha = square, alpha
        if need:
            if store_kl and square and gm is not None:
                gl.add_(work_matrix(n, n_cols, gl).copy_(gm.t()), alpha=alpha)  # merge: dL += alpha * (dKL/dL.T).T
            ctx.save_for_backward(x, xp_cols, xp_rows, x_cols, s)
            # on the context, not saved tensors: the work matrices' pool sees them taken until the graph is freed
            ctx.gl, ctx.gm = gl, (gm if store_kl and not square else None)
        del gm
        kl_sum = kl_parts.sum()
        loss_sum = loss_parts.sum() + alpha * kl_sum if alpha != 0.0 else loss_parts.sum()
        return loss_sum, kl_sum

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, g_loss: torch.Tensor | None, g_kl: torch.Tensor | None) -> tuple[Any, ...]:
        x, xp_cols, xp_rows, x_cols, s = ctx.saved_tensors
        gl, gm = ctx.gl, ctx.gm
        need = ctx.needs_input_grad
        grads: list[torch.Tensor | None] = [None] * 6  # x, xp_cols, xp_rows, x_cols, s, b

        def add(i: int, g: torch.Tensor | None) -> None:
            if g is not None:
                grads[i] = g if grads[i] is None else grads[i] + g  # type: ignore[operator]

        def contribute(mat: torch.Tensor, w: torch.Tensor, ir: int, ic: int, rows: torch.Tensor, cols: torch.Tensor) -> None:
            """Pull ``w * sum_ij mat_ij dZ_ij`` back through ``Z = s * rows @ cols.T + b``."""
            w = w.to(mat.dtype)
            if need[ir] or need[4]:
                gc = torch.mm(mat, cols)  # [n, d]
                if need[4]:
                    add(4, torch.dot(gc.view(-1), rows.reshape(-1)) * w)
                if need[ir]:
                    add(ir, gc.mul_(s * w))
            if need[ic]:
                add(ic, torch.mm(mat.t(), rows * (s * w)))
            if need[5]:
                add(5, mat.sum() * w)

        # autocast off, as in forward: a backward called inside an autocast region would otherwise run these
        # products in bf16/fp16
        with torch.autocast(device_type=x.device.type, enabled=False):
            if g_loss is not None:
                contribute(gl, g_loss, 0, 1, x, xp_cols)
                if gm is not None:
                    contribute(gm, g_loss * ctx.alpha, 2, 3, xp_rows, x_cols)
            if g_kl is not None:  # the returned KL itself is differentiated: recompute its gradient matrices
                d, dm = _kl_gradients(x, xp_cols, xp_rows, x_cols, s, ctx.square)
                contribute(d, g_kl, 0, 1, x, xp_cols)
                if dm is not None:
                    contribute(dm, g_kl, 2, 3, xp_rows, x_cols)
        return (*grads, None, None, None, None, None, None)


def _kl_gradients(
    x: torch.Tensor,
    xp_cols: torch.Tensor,
    xp_rows: torch.Tensor,
    x_cols: torch.Tensor,
    s: torch.Tensor,
    square: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``dKL/dL`` and ``dKL/d(L.T)`` (``[n, N]``; merged into the first when ``square``), recomputed."""
    gl = _logits(x, xp_cols, s)
    gm = _transposed_logits(gl, xp_rows, x_cols, s, square)
    d = torch.empty_like(gl)
    shift = _exp_shift(s)
    n, n_cols = gl.shape
    rows = _row_block(n_cols, gl.device, n)
    t = gl.new_empty(rows, n_cols)
    for i0 in range(0, n, rows):
        k = min(rows, n - i0)
        _kl_block(gl[i0 : i0 + k], gm[i0 : i0 + k], d[i0 : i0 + k], t[:k], True, shift)
    d.neg_()  # P - T
    if square:
        return d.add_(gm.t().contiguous()), None
    return d, gm


# ----------------------------------------------------------------------------
# validation
# ----------------------------------------------------------------------------
def _check_features(x: Any, x_prime: Any) -> None:
    for name, t in (("x", x), ("x_prime", x_prime)):
        check_tensor(name, t, floating=True, layout="[n, dim]")
        check_tensor(name, t, dim=2, layout="[n, dim]", hint="one row per sample; flatten the feature dims with .flatten(1)")
    if x.shape != x_prime.shape:
        raise ValueError(
            f"x and x_prime must have the same shape [n, dim] (row i of x and row i of x_prime are the two views "
            f"of sample i), got {tuple(x.shape)} and {tuple(x_prime.shape)}"
        )
    if x.shape[0] < 1 or x.shape[1] < 1:
        raise ValueError(f"x and x_prime must be non-empty [n, dim] with n >= 1, got shape {tuple(x.shape)}")
    if x.device != x_prime.device:
        raise ValueError(f"x and x_prime must be on the same device, got {x.device} and {x_prime.device}")


def _as_param(name: str, value: Any, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``tau`` / ``b`` as a 0-d tensor of ``dtype`` on ``device`` (a tensor keeps its graph)."""
    if isinstance(value, torch.Tensor):
        check_tensor(name, value, floating=True)
        if value.numel() != 1:
            raise ValueError(f"{name} must be a scalar (0-d or one-element tensor), got shape {tuple(value.shape)}")
        return value.reshape(()).to(device=device, dtype=dtype)
    number = check_float(name, value, allow_inf=True, expect="a scalar tensor or a number")
    return torch.tensor(number, dtype=dtype, device=device)


def _row_mean_scale(n_local: int, distributed: bool, like: torch.Tensor) -> float | torch.Tensor:
    """Factor turning a sum over local rows into this rank's share of the global row mean.

    ``1 / n`` on one process; ``W / N`` under DDP (:func:`cloc_lightning.distributed.global_mean`'s
    convention: the mean over ranks of the returned values is the mean over all rows), which is
    ``1 / n`` again, exchanged with no rank, when the sizes are known to be equal
    (:func:`cloc_lightning.distributed.mean_scale`).
    """
    if not distributed:
        return 1.0 / n_local
    return dist_utils.mean_scale(n_local, like)


# ----------------------------------------------------------------------------
# public API
# ----------------------------------------------------------------------------
def sigmoid_contrastive_loss(
    x: torch.Tensor,
    x_prime: torch.Tensor,
    tau: Scalar,
    b: Scalar,
    alpha: float = 0.0,
    max_tau: float = 5.0,
    gamma: float = 0.0,
    global_step: int = -1,
    penalty_filtering: bool = False,
    filtering_warmup_steps: int = 5000,
    filtering_threshold: float = 0.05,
    gather_distributed: bool = False,
    compute_invariance: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Sigmoid contrastive loss (the seed's ``scl_loss``); see the module docstring for the formula.

    Args:
        x: online projections ``[n, dim]`` (any float dtype; L2-normalised here).
        x_prime: target projections ``[n, dim]``; row ``i`` is the positive of ``x[i]``.
        tau: log logit scale (0-d tensor, usually a learnable parameter, or a number);
            the scale is ``clamp(exp(tau), 0, max_tau)`` (no gradient to ``tau`` while
            ``exp(tau) > max_tau``).
        b: logit bias (0-d tensor or number).
        alpha: weight (>= 0) of the KL invariance term added to the loss.
        max_tau: upper clamp (> 0) of the logit scale.
        gamma: confidence-penalty exponent (>= 0); 0 = plain SigLIP loss.
        global_step: the optimiser step (for penalty filtering); -1 = unknown (never filters).
        penalty_filtering: once ``global_step > filtering_warmup_steps`` (the seed's
            comparison), drop negatives with penalty <= ``filtering_threshold`` and sum
            the kept pairs' ``-logsigmoid`` without the penalty weight (the seed).
        filtering_warmup_steps: the last step (>= 0) of the weighted warm-up; filtering
            starts at the step after it.
        filtering_threshold: penalty threshold (>= 0) a negative must exceed to be kept.
        gather_distributed: score the local rows against the global batch (see the module
            docstring); ignored on a single process.
        compute_invariance: compute the KL value even when ``alpha == 0`` (the seed always
            returns it, for logging; default).  ``False`` skips it -- the plain SigLIP
            loss then costs what open_clip's ``SigLipLoss`` costs -- and returns ``None``
            for it; it needs ``alpha == 0``.

    Returns:
        ``(loss, invariance_loss)``: scalar float32 tensors (float64 for float64 inputs);
        ``invariance_loss`` is the KL term (already included as ``alpha * KL`` in ``loss``),
        ``None`` with ``compute_invariance=False``.
        Under ``gather_distributed`` both are this rank's share (their mean over ranks is
        the value on the concatenated batch).

    Example::

        >>> import math, torch
        >>> x, xp = torch.randn(8, 16), torch.randn(8, 16)
        >>> tau = torch.tensor(math.log(5.0), requires_grad=True)
        >>> b = torch.tensor(-5.0, requires_grad=True)
        >>> loss, kl = sigmoid_contrastive_loss(x, xp, tau, b, alpha=1.0, gamma=1.0)
        >>> loss.backward()
        >>> tau.grad is not None and bool(torch.isfinite(loss))
        True
    """
    _check_features(x, x_prime)
    alpha_f = check_float("alpha", alpha, minimum=0.0, hint=_HINTS["alpha"])
    gamma_f = check_float("gamma", gamma, minimum=0.0, hint=_HINTS["gamma"])
    max_tau_f = check_float("max_tau", max_tau, minimum=0.0, strict_minimum=True, hint=_HINTS["max_tau"])
    step = check_int("global_step", global_step, hint="the optimiser step; -1 = unknown")
    warmup = check_int("filtering_warmup_steps", filtering_warmup_steps, 0)
    thr = check_float("filtering_threshold", filtering_threshold, minimum=0.0, hint=_HINTS["filtering_threshold"])
    dtype = torch.float64 if torch.float64 in (x.dtype, x_prime.dtype) else torch.float32
    device = x.device
    tau_t = _as_param("tau", tau, dtype, device)
    b_t = _as_param("b", b, dtype, device)
    # the seed filters from the step AFTER filtering_warmup_steps (global_step > warm-up)
    threshold = thr if (penalty_filtering and step > warmup) else None
    if not compute_invariance and alpha_f != 0.0:
        raise ValueError(
            f"compute_invariance=False skips the KL term, but alpha={alpha_f} adds it to the loss; set alpha=0.0 or compute_invariance=True"
        )

    with torch.autocast(device_type=device.type, enabled=False):
        xn = F.normalize(x.to(dtype), dim=1)
        xpn = F.normalize(x_prime.to(dtype), dim=1)
        s = tau_t.exp().clamp(0.0, max_tau_f)
        distributed = gather_distributed and dist_utils.is_distributed()
        if distributed:
            xp_cols = dist_utils.gather(xpn)
            x_cols = dist_utils.gather(xn)
            offset = dist_utils.local_offset(xn.shape[0], device)
        else:
            xp_cols, x_cols, offset = xpn, xn, 0
        loss_sum, kl_sum = _SigmoidContrastive.apply(
            xn,
            xp_cols,
            xpn,
            x_cols,
            s,
            b_t,
            offset,
            gamma_f,
            threshold,
            alpha_f,
            not distributed,
            bool(compute_invariance),
        )
        scale = _row_mean_scale(xn.shape[0], distributed, xn)
        return loss_sum * scale, (kl_sum * scale if compute_invariance else None)


class SigmoidContrastiveLoss(Loss):
    r"""Sigmoid contrastive loss module owning the logit scale ``tau`` and bias ``b``.

    The criterion of ReLIC-sigmoid (seed: F. Basara's ``scl_train``; ReLIC, Mitrovic et
    al. 2020; SigLIP, Zhai et al. 2023): ``forward(x, x_prime)`` returns
    ``(loss, invariance_loss)`` of :func:`sigmoid_contrastive_loss` with this module's
    ``tau``, ``b`` and options.

    Args:
        init_tau: initial log logit scale (the seed's training script: ``log 5``).
        init_b: initial logit bias (the seed's training script: ``-5``).
        max_tau: upper clamp of ``exp(tau)`` (default 5).
        alpha: weight of the KL invariance term (>= 0).
        gamma: default confidence-penalty exponent (>= 0); ``forward(..., gamma=...)``
            overrides it per call, so a training module can schedule gamma.
        learnable: ``tau`` and ``b`` are ``nn.Parameter`` s (default); else buffers (still
            in ``state_dict``).
        penalty_filtering: see
            :func:`sigmoid_contrastive_loss`.
        filtering_warmup_steps: see ``penalty_filtering``.
        filtering_threshold: see ``penalty_filtering``.
        gather_distributed: score local rows against the global batch under DDP.

    Shapes:
        ``x``, ``x_prime``: ``[n, dim]``; returns two scalars.

    Example::

        >>> import torch
        >>> crit = SigmoidContrastiveLoss(alpha=1.0, gamma=1.0)
        >>> loss, kl = crit(torch.randn(8, 64), torch.randn(8, 64), global_step=0)
        >>> round(crit.temperature, 4)   # 1 / clamp(exp(tau), 0, max_tau) = 1 / 5
        0.2
    """

    tau: torch.Tensor
    b: torch.Tensor

    def __init__(
        self,
        init_tau: float = math.log(5.0),
        init_b: float = -5.0,
        max_tau: float = 5.0,
        alpha: float = 0.0,
        gamma: float = 0.0,
        learnable: bool = True,
        penalty_filtering: bool = False,
        filtering_warmup_steps: int = 5000,
        filtering_threshold: float = 0.05,
        gather_distributed: bool = False,
    ) -> None:
        super().__init__()
        init_tau = check_float("init_tau", init_tau)
        init_b = check_float("init_b", init_b)
        self.max_tau = check_float("max_tau", max_tau, minimum=0.0, strict_minimum=True, hint=_HINTS["max_tau"])
        self.alpha = check_float("alpha", alpha, minimum=0.0, hint=_HINTS["alpha"])
        self.gamma = check_float("gamma", gamma, minimum=0.0, hint=_HINTS["gamma"])
        self.penalty_filtering = bool(penalty_filtering)
        self.filtering_warmup_steps = check_int("filtering_warmup_steps", filtering_warmup_steps, 0)
        self.filtering_threshold = check_float("filtering_threshold", filtering_threshold, minimum=0.0, hint=_HINTS["filtering_threshold"])
        self.gather_distributed = bool(gather_distributed)
        self.learnable = bool(learnable)
        tau_t = torch.tensor(init_tau)
        b_t = torch.tensor(init_b)
        if self.learnable:
            self.tau = nn.Parameter(tau_t)
            self.b = nn.Parameter(b_t)
        else:
            self.register_buffer("tau", tau_t)
            self.register_buffer("b", b_t)

    @property
    def logit_scale(self) -> float:
        """Current logit scale ``clamp(exp(tau), 0, max_tau)``."""
        return float(min(math.exp(float(self.tau.detach())), self.max_tau))

    @property
    def temperature(self) -> float:
        """Current temperature ``1 / logit_scale`` (for logging)."""
        scale = self.logit_scale
        return math.inf if scale == 0.0 else 1.0 / scale

    def forward(self, x: torch.Tensor, x_prime: torch.Tensor, gamma: float | None = None, global_step: int = -1) -> torch.Tensor:
        """The loss of online ``x`` [n, dim] against target ``x_prime`` [n, dim] (the parts: :meth:`compute`)."""
        return self.compute(x, x_prime, gamma, global_step).loss

    def compute(self, x: torch.Tensor, x_prime: torch.Tensor, gamma: float | None = None, global_step: int = -1) -> LossOutput:
        """``LossOutput(loss, {"invariance": the KL term (detached; in the loss with weight alpha)})``.

        ``gamma`` overrides the module's exponent for this call (for schedules);
        ``global_step`` drives penalty filtering.
        """
        loss, invariance = sigmoid_contrastive_loss(
            x,
            x_prime,
            self.tau,
            self.b,
            alpha=self.alpha,
            max_tau=self.max_tau,
            gamma=self.gamma if gamma is None else gamma,
            global_step=global_step,
            penalty_filtering=self.penalty_filtering,
            filtering_warmup_steps=self.filtering_warmup_steps,
            filtering_threshold=self.filtering_threshold,
            gather_distributed=self.gather_distributed,
        )
        return LossOutput(loss, {} if invariance is None else {"invariance": invariance.detach()})

    def extra_repr(self) -> str:
        return (
            f"max_tau={self.max_tau}, alpha={self.alpha}, gamma={self.gamma}, learnable={self.learnable}, "
            f"penalty_filtering={self.penalty_filtering}, filtering_warmup_steps={self.filtering_warmup_steps}, "
            f"filtering_threshold={self.filtering_threshold}, gather_distributed={self.gather_distributed}"
        )
