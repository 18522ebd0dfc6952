"""The CPU work matrices of the fused losses (``losses/_workspace.py``): reused only when nothing refers to them, so
reuse never overwrites a result a graph still needs (two forwards before one backward, ``retain_graph``)."""

from __future__ import annotations

import math

import pytest
import torch

from cloc_lightning.losses import _workspace
from cloc_lightning.losses.sigmoid import sigmoid_contrastive_loss


@pytest.fixture(autouse=True)
def _empty_pool() -> None:
    _workspace.clear()


def _grads(x: torch.Tensor, xp: torch.Tensor, **kw: float) -> list[torch.Tensor]:
    xx, xxp = x.clone().requires_grad_(True), xp.clone().requires_grad_(True)
    tau = torch.tensor(math.log(5.0), requires_grad=True)
    b = torch.tensor(-5.0, requires_grad=True)
    loss = sigmoid_contrastive_loss(xx, xxp, tau, b, **kw)[0]
    return [loss.detach(), *torch.autograd.grad(loss, [xx, xxp, tau, b])]


def test_a_free_buffer_is_handed_out_again_and_a_held_one_is_not() -> None:
    like = torch.zeros(1)
    a = _workspace.work_matrix(8, 16, like)
    b = _workspace.work_matrix(8, 16, like)
    assert a.data_ptr() != b.data_ptr()  # a is held by this test
    ptr = a.data_ptr()
    del a
    assert _workspace.work_matrix(8, 16, like).data_ptr() == ptr  # free again: reused
    assert _workspace.work_matrix(8, 16, like.double()).dtype == torch.float64  # another dtype: another buffer


@pytest.mark.parametrize("kw", [dict(alpha=1.0, gamma=1.0), dict(alpha=0.0, gamma=0.0), dict(alpha=0.5, gamma=2.0)])
def test_two_forwards_before_backward_give_each_its_own_gradients(kw: dict[str, float]) -> None:
    g = torch.Generator().manual_seed(0)
    inputs = [(torch.randn(24, 8, generator=g), torch.randn(24, 8, generator=g)) for _ in range(2)]
    expected = [_grads(x, xp, **kw) for x, xp in inputs]
    _workspace.clear()
    taus = [torch.tensor(math.log(5.0), requires_grad=True) for _ in inputs]
    leaves = [(x.clone().requires_grad_(True), xp.clone().requires_grad_(True)) for x, xp in inputs]
    losses = [sigmoid_contrastive_loss(x, xp, t, -5.0, **kw)[0] for (x, xp), t in zip(leaves, taus, strict=True)]  # both graphs alive
    for loss, (x, xp), t, want in zip(reversed(losses), reversed(leaves), reversed(taus), reversed(expected), strict=True):
        got = torch.autograd.grad(loss, [x, xp, t])
        for a, w in zip(got, want[1:4], strict=True):
            torch.testing.assert_close(a, w, rtol=0, atol=0)


def test_retain_graph_backward_twice_and_a_loop_reuses_the_matrices() -> None:
    x, xp = torch.randn(32, 8), torch.randn(32, 8)
    want = _grads(x, xp, alpha=1.0, gamma=1.0)
    xx = x.clone().requires_grad_(True)
    loss = sigmoid_contrastive_loss(xx, xp, math.log(5.0), -5.0, alpha=1.0, gamma=1.0)[0]
    first = torch.autograd.grad(loss, xx, retain_graph=True)[0]
    sigmoid_contrastive_loss(torch.randn(32, 8), torch.randn(32, 8), 1.0, 0.0, alpha=1.0, gamma=1.0)  # in between
    second = torch.autograd.grad(loss, xx)[0]
    torch.testing.assert_close(first, want[1], rtol=0, atol=0)
    torch.testing.assert_close(second, want[1], rtol=0, atol=0)
    del loss
    kept = {id(t) for pool in _workspace._pools.values() for t in pool}
    for _ in range(3):  # a training loop: every step's matrices come from the pool, nothing new is kept
        step = sigmoid_contrastive_loss(torch.randn(32, 8, requires_grad=True), torch.randn(32, 8), 1.0, 0.0, alpha=1.0, gamma=1.0)[0]
        step.backward()
    assert {id(t) for pool in _workspace._pools.values() for t in pool} == kept
    assert all(len(pool) <= _workspace.MAX_BUFFERS for pool in _workspace._pools.values())
