"""The gradient-caching engine on its own (cloc_lightning/methods/grad_cache.py): exact whole-batch gradients.

Reference: the same network and loss as one graph over the whole batch (plain autograd), in float64.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from cloc_lightning.methods.grad_cache import cached_backward, mini_batch_slices


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 7), nn.BatchNorm1d(7), nn.Dropout(0.3), nn.Linear(7, 3)).double()


def _loss(outs: list[torch.Tensor], scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch-coupled loss (every row meets every other, as a contrastive loss does) with a learnable scale."""
    a, b = outs
    sim = scale * a @ b.T
    return torch.logsumexp(sim, dim=1).mean() - sim.diagonal().mean(), sim.mean()


@pytest.mark.parametrize("batch,mini", [(8, 2), (12, 4), (9, 3)])
def test_cached_backward_is_the_whole_batch_gradient_without_dropout(batch: int, mini: int) -> None:
    """Several mini-batches, deterministic network (no dropout, BatchNorm in eval): equal to one graph."""
    x1, x2 = torch.randn(batch, 5, dtype=torch.float64), torch.randn(batch, 5, dtype=torch.float64)
    ref_net = _net().eval()
    ref_scale = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    ref_loss, _ = _loss([ref_net(x1), ref_net(x2)], ref_scale)
    probe = (ref_net[0].weight ** 2).sum()
    (ref_loss + probe).backward()

    net = _net().eval()
    scale = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    calls: list[bool] = []

    def backward(t: torch.Tensor, last: bool) -> None:
        calls.append(last)
        t.backward()

    loss, _ = cached_backward(
        lambda sl: [net(x1[sl]), net(x2[sl])],
        mini_batch_slices(batch, mini),
        lambda o: _loss(o, scale),
        backward,
        device=x1.device,
        params=[scale],
        last_extra=(net[0].weight ** 2).sum(),
    )
    torch.testing.assert_close(loss, ref_loss.detach())
    for p, q in zip(net.parameters(), ref_net.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad)
    torch.testing.assert_close(scale.grad, ref_scale.grad)
    assert calls == [False] * (batch // mini - 1) + [True]  # DDP sync only on the last mini-batch


@pytest.mark.parametrize("batch,mini", [(8, 4), (12, 3)])
def test_cached_backward_replays_each_mini_batchs_random_draws_and_updates_batchnorm_once(batch: int, mini: int) -> None:
    """Dropout and BatchNorm in training mode.  Reference: one graph over the mini-batches' forwards in the
    same order (same dropout masks, per-mini-batch BatchNorm statistics), the loss on their concatenation."""
    x1, x2 = torch.randn(batch, 5, dtype=torch.float64), torch.randn(batch, 5, dtype=torch.float64)
    slices = mini_batch_slices(batch, mini)
    ref_net, ref_scale = _net(), torch.tensor(1.0, dtype=torch.float64, requires_grad=True)
    torch.manual_seed(3)
    outs: list[list[torch.Tensor]] = [[], []]
    for sl in slices:
        outs[0].append(ref_net(x1[sl]))
        outs[1].append(ref_net(x2[sl]))
    ref_loss, _ = _loss([torch.cat(o) for o in outs], ref_scale)
    ref_loss.backward()

    net, scale = _net(), torch.tensor(1.0, dtype=torch.float64, requires_grad=True)
    torch.manual_seed(3)
    loss, _ = cached_backward(
        lambda sl: [net(x1[sl]), net(x2[sl])],
        slices,
        lambda o: _loss(o, scale),
        lambda t, last: t.backward(),
        device=x1.device,
        params=[scale],
        buffers=list(net.buffers()),
    )
    after = torch.rand(1)
    torch.manual_seed(3)
    for _ in range(2 * len(slices)):  # pass 1's draws: the generator ends where one forward pass leaves it
        torch.nn.functional.dropout(torch.ones(mini, 7, dtype=torch.float64), 0.3)
    torch.testing.assert_close(after, torch.rand(1))
    torch.testing.assert_close(loss, ref_loss.detach())
    for p, q in zip(net.parameters(), ref_net.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad)
    torch.testing.assert_close(scale.grad, ref_scale.grad)
    for b, rb in zip(net.buffers(), ref_net.buffers(), strict=True):  # running statistics updated once
        torch.testing.assert_close(b, rb)


@pytest.mark.parametrize("batch,mini", [(10, 4), (4, 8)])
def test_mini_batch_slices_refuses_a_size_that_does_not_divide_the_batch(batch: int, mini: int) -> None:
    with pytest.raises(ValueError, match="does not divide the batch.*drop_last: true"):
        mini_batch_slices(batch, mini)


def test_mini_batch_slices_cover_the_batch() -> None:
    assert mini_batch_slices(6, None) == [slice(0, 6)]
    assert mini_batch_slices(6, 2) == [slice(0, 2), slice(2, 4), slice(4, 6)]
