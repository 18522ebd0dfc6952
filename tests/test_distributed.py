"""gather / gather_no_grad / global_mean on 2 gloo processes against one process."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from cloc_lightning import distributed as D
from tests._ddp import run_distributed


def _full_problem(sizes: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(sum(sizes), 3, generator=g, dtype=torch.float64)
    w = torch.randn(3, generator=g, dtype=torch.float64)
    return x, w


def _loss(local_rows: torch.Tensor, all_rows: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    # local anchors against the global batch: l_i = logsumexp_j (x_i . x_j) + x_i . w
    per_anchor = torch.logsumexp(local_rows @ all_rows.T, dim=1) + local_rows @ w
    return per_anchor


def _rank_fn(rank: int, world: int, sizes: tuple[int, ...]) -> dict:
    x, w = _full_problem(sizes)
    start = sum(sizes[:rank])
    xl = x[start : start + sizes[rank]].clone().requires_grad_(True)
    xg = D.gather(xl)
    loss = D.global_mean(_loss(xl, xg, w))
    loss.backward()
    reduced = D.all_reduce_sum(loss.detach()) / world
    return {
        "loss": reduced,
        "grad": xl.grad / world,  # DDP divides parameter gradients by W
        "offset": D.local_offset(sizes[rank]),
        "labels": D.gather_no_grad(torch.arange(sizes[rank]) + 100 * rank),
        "ws": D.world_size(),
    }


def _single(sizes: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    x, w = _full_problem(sizes)
    x = x.clone().requires_grad_(True)
    loss = _loss(x, x, w).mean()
    loss.backward()
    return loss.detach(), x.grad


def test_single_process_is_identity() -> None:
    x = torch.randn(4, 2, requires_grad=True)
    assert D.gather(x) is x
    assert D.world_size() == 1 and D.rank() == 0 and D.local_offset(4) == 0
    assert torch.equal(D.global_mean(torch.tensor([1.0, 2.0, 6.0])), torch.tensor(3.0))


@pytest.mark.slow  # 2-process DDP: the long tier (pytest -m slow)
def test_gather_with_grad_equals_single_process_even_and_uneven() -> None:
    for sizes in [(3, 3), (4, 2)]:
        results = run_distributed(_rank_fn, 2, sizes)
        loss, grad = _single(sizes)
        for r, res in enumerate(results):
            assert res["ws"] == 2
            assert res["offset"] == sum(sizes[:r])
            torch.testing.assert_close(res["loss"], loss, rtol=1e-10, atol=1e-10)
            start = sum(sizes[:r])
            torch.testing.assert_close(res["grad"], grad[start : start + sizes[r]], rtol=1e-10, atol=1e-10)
            expected_labels = torch.cat([torch.arange(n) + 100 * i for i, n in enumerate(sizes)])
            assert torch.equal(res["labels"], expected_labels)


def _one_rank_gloo_group() -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    assert dist.is_initialized()


def test_release_process_group_destroys_the_group_and_is_a_noop_without_one() -> None:
    import torch.distributed as dist

    D.release_process_group()  # nothing initialised: nothing to do
    _one_rank_gloo_group()
    D.release_process_group()
    assert not dist.is_initialized()
    D.release_process_group()


def test_the_command_line_releases_the_process_group_whatever_way_it_ends(capsys: Any) -> None:
    """A gloo group left to the interpreter's exit can abort a finished DDP run (exit -6): main() ends it."""
    import torch.distributed as dist

    from tests.conftest import cli_in_process

    for args, code in ((["fit", "--help"], 0), (["fit", "--model", "NoSuchModule"], 2)):
        _one_rank_gloo_group()
        try:
            got, _, _ = cli_in_process(args, capsys)
            assert got == code, args
            assert not dist.is_initialized(), args
        finally:
            D.release_process_group()


# ------------------------------------------------------------------ equal sizes: no size exchange, no host read
def _rank_fn_equal_sizes(rank: int, world: int, sizes: tuple[int, ...]) -> dict:
    """:func:`_rank_fn` inside ``assume_equal_sizes()``, counting the host reads (``Tensor.item``) it makes; then an
    explicit ``equal_sizes=False`` inside the block, which exchanges the sizes again."""
    reads: list[str] = []
    item = torch.Tensor.item

    def counting_item(t: torch.Tensor) -> Any:
        reads.append("item")
        return item(t)

    torch.Tensor.item = counting_item  # type: ignore[method-assign]
    try:
        with D.assume_equal_sizes():
            assert D.sizes_assumed_equal()
            out = _rank_fn(rank, world, sizes)
            out["reads"] = len(reads)
            out["offset_exchanged"] = D.local_offset(sizes[rank], equal_sizes=False)
            out["reads_exchanged"] = len(reads) - out["reads"]
            with D.assume_equal_sizes(False):
                out["inner"] = D.sizes_assumed_equal()
            out["restored"] = D.sizes_assumed_equal()
    finally:
        torch.Tensor.item = item  # type: ignore[method-assign]
    out["outside"] = D.sizes_assumed_equal()
    return out


@pytest.mark.slow
@pytest.mark.ddp
def test_gather_with_equal_sizes_reads_nothing_and_equals_single_process() -> None:
    sizes = (3, 3)
    results = run_distributed(_rank_fn_equal_sizes, 2, sizes)
    loss, grad = _single(sizes)
    for r, res in enumerate(results):
        assert res["reads"] == 0, res["reads"]  # gather, gather_no_grad, local_offset and global_mean
        assert res["offset"] == res["offset_exchanged"] == 3 * r and res["reads_exchanged"] == 2  # one .item() per rank
        assert (res["inner"], res["restored"], res["outside"]) == (False, True, False)
        torch.testing.assert_close(res["loss"], loss, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(res["grad"], grad[3 * r : 3 * r + 3], rtol=1e-10, atol=1e-10)
        assert torch.equal(res["labels"], torch.cat([torch.arange(3), torch.arange(3) + 100]))


def test_equal_sizes_come_from_full_batches_only() -> None:
    """``loader_batches_equal``: a DataLoader that batches itself with ``drop_last``; anything else may differ per rank."""
    from torch.utils.data import BatchSampler, DataLoader, SequentialSampler

    data = list(range(10))
    assert D.loader_batches_equal(DataLoader(data, batch_size=4, drop_last=True))
    assert not D.loader_batches_equal(DataLoader(data, batch_size=4, drop_last=False))
    assert not D.loader_batches_equal(DataLoader(data, batch_sampler=BatchSampler(SequentialSampler(data), 4, drop_last=True)))
    assert not D.loader_batches_equal([DataLoader(data, batch_size=4, drop_last=True)])  # several loaders: not read
    assert not D.loader_batches_equal(None)
    assert not D.sizes_assumed_equal() and D.sizes_assumed_equal(True) and not D.sizes_assumed_equal(False)
    with D.assume_equal_sizes():
        assert D.sizes_assumed_equal() and not D.sizes_assumed_equal(False)
    assert D.mean_scale(4, torch.zeros(())) == 0.25  # one process: 1 / n


def test_training_gathers_of_a_module_without_trainer_exchange_sizes() -> None:
    from cloc_lightning.methods import CEModule
    from tests.conftest import TINY_BACKBONE

    module = CEModule(num_classes=3, backbone=TINY_BACKBONE)
    with module.training_gathers():
        assert not D.sizes_assumed_equal()
