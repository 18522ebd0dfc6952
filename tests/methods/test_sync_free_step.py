"""The training step never waits for the device: 0 library host syncs on a typical step, every module.

Counted through a real ``Trainer.fit`` (TensorBoard logger, progress bar, the modules' own
callbacks) with the sync-causing calls patched (``tests/_syncs.py``).  A typical step is a
training batch that is not the first, not the last and not one of Lightning's logging steps
(every ``log_every_n_steps``), on which the value checks are read (docs/benchmarks.md,
"Host syncs per training step").  Also checked: a plain LightningModule's count (what
Lightning itself costs) bounds every module's total, and the deferred checks still stop a
run, at most ``log_every_n_steps`` batches late, with the message they always had.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.loggers import TensorBoardLogger
from torch import nn

from cloc_lightning.callbacks import CLOCMarginPlot
from cloc_lightning.checks import DeferredChecks, require
from cloc_lightning.methods import ReLICModule
from tests._reliability import MODULES, RELIC_ARGS, SMALL, _make, _shapes
from tests._syncs import CPU_ONLY, SyncCounter
from tests.conftest import cpu_trainer

LOG_EVERY = 5
BATCHES = 13


class _Plain(L.LightningModule):
    """A plain LightningModule with one ``prog_bar`` metric: what Lightning itself syncs per step."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 4))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def _count(model: L.LightningModule, dm: L.LightningDataModule, tmp_path: Path, callbacks: list[Any] | None = None) -> SyncCounter:
    counter = SyncCounter()
    trainer = cpu_trainer(
        tmp_path,
        max_epochs=1,
        limit_train_batches=BATCHES,
        limit_val_batches=1,
        num_sanity_val_steps=0,
        log_every_n_steps=LOG_EVERY,
        logger=TensorBoardLogger(str(tmp_path), name="syncs"),
        enable_progress_bar=True,
        callbacks=[counter, *(callbacks or [])],
    )
    with warnings.catch_warnings(), counter.patched():
        warnings.simplefilter("ignore")
        trainer.fit(model, datamodule=dm)
    assert len(counter.train_batches) == BATCHES
    return counter


def _data(name: str, dm: Any) -> Any:
    """The module's data, with enough batches for typical steps between Lightning's logging steps."""
    return type(dm)(
        num_classes=4,
        train_size=8 * BATCHES,
        val_size=8,
        test_size=8,
        batch_size=8,
        num_workers=0,
        image_size=dm.image_size,
        augment="none",
        train_views=dm.train_views,
    )


def test_plain_lightning_module_baseline(tmp_path: Path) -> None:
    """The reference count: Lightning's own syncs on a typical step (none of them the library's)."""
    counter = _count(_Plain(), _shapes(train_size=8 * BATCHES), tmp_path)
    typical = counter.steps()
    assert len(typical) >= 6
    assert not counter.summary(typical, library=True)
    totals = {len(v) for v in counter.per_step(typical, library=None).values()}
    assert max(totals) <= 3, counter.summary(typical, library=None)  # the progress bar's reads of its metrics


@pytest.fixture(scope="module")
def plain_baseline(tmp_path_factory: pytest.TempPathFactory) -> dict[str, int]:
    plain = _count(_Plain(), _shapes(train_size=8 * BATCHES), tmp_path_factory.mktemp("plain"))
    return {"most": max(len(v) for v in plain.per_step(plain.steps(), library=None).values())}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_library_sync_on_a_typical_training_step(name: str, tmp_path: Path, plain_baseline: dict[str, int]) -> None:
    extra: dict[str, Any] = {}
    callbacks: list[Any] = []
    if name == "ReLICModule":
        extra["knn_k"] = 3  # the kNN bank is written every step
    if name == "CLOCModule":
        callbacks.append(CLOCMarginPlot(every_n_steps=2))  # records the margins every other step
    model, dm = _make(name)
    if extra:  # the kNN monitor on: ReLIC with the reliability tests' small settings but knn_k > 0
        torch.manual_seed(0)
        model = ReLICModule(num_classes=4, task="ordinal", **{**RELIC_ARGS, **extra}, **SMALL)
    counter = _count(model, _data(name, dm), tmp_path, callbacks)
    typical = counter.steps()
    assert len(typical) >= 6, typical
    library = counter.summary(typical, library=True)
    assert not library, f"{name}: host syncs of the library on typical training steps: {dict(library)}"
    most = plain_baseline["most"]
    totals = counter.per_step(typical, library=None)
    assert max(len(v) for v in totals.values()) <= most, counter.summary(typical, library=None)
    # logging steps: the one read of the deferred checks, plus what self.log needs for logged Python numbers
    for step in sorted(counter.logging_steps)[:-1]:
        events = [e for e in counter.events.get(step, []) if e.library]
        reads = [e for e in events if "checks.py" in e.where]
        others = [e for e in events if "checks.py" not in e.where and not e.kind.startswith("torch.tensor(number)")]
        assert len(reads) == 1 and not others, (step, [(e.kind, e.where) for e in events])


def test_the_counter_sees_each_kind_of_sync(tmp_path: Path) -> None:
    """The patched calls are counted (the test above could not fail otherwise)."""
    counter = SyncCounter(batch=0)
    t = torch.arange(6.0)
    with counter.patched():
        t.sum().item()
        bool(t.sum())
        float(t[0])
        t.tolist()
        torch.unique(t)
        torch.bincount(t.long())
        t[t > 2]
        torch.tensor(1.5)
        require(torch.isfinite(t), "not reached")  # outside a Trainer step: read at once (one bool)
    kinds = [e.kind for e in counter.events[0]]
    for kind in (
        "Tensor.item",
        "Tensor.__bool__",
        "Tensor.__float__",
        "Tensor.tolist",
        "torch.unique",
        "torch.bincount",
        "boolean-mask indexing",
        "torch.tensor(number): host-to-device copy",
    ):
        assert kind in kinds, (kind, kinds)
    assert [e.library for e in counter.events[0]][-1]  # the read inside cloc_lightning.checks is the library's


def test_the_cpu_only_fast_paths_are_not_taken_off_the_cpu() -> None:
    """The two library functions the counter leaves out (``tests._syncs.CPU_ONLY``) read values only on CPU."""
    from cloc_lightning.losses import cloc, sigmoid

    assert {"_argsort_rows_packed", "_exp_shift"} == CPU_ONLY
    meta = torch.ones(4, 6, device="meta")
    assert sigmoid._exp_shift(torch.tensor(10.0, device="meta")) is None
    calls = []
    original = cloc._argsort_rows_packed
    cloc._argsort_rows_packed = lambda *a: calls.append(a)  # type: ignore[assignment]
    try:
        cloc._argsort_rows(meta, torch.zeros(4, 6, dtype=torch.bool, device="meta"))
        assert not calls
        cloc._argsort_rows(torch.ones(4, 6), torch.zeros(4, 6, dtype=torch.bool))
        assert len(calls) == 1  # the CPU path is the packed sort
    finally:
        cloc._argsort_rows_packed = original


def test_deferred_checks_record_without_reading_and_raise_the_first_failure() -> None:
    checks = DeferredChecks()
    counter = SyncCounter(batch=0)
    with counter.patched(), checks.active():
        for step in range(4):
            checks.advance(torch.device("cpu"))
            require(torch.tensor([True, step < 2]), "loss is not finite", FloatingPointError)
            require(torch.tensor(True), "labels out of range")
    assert not counter.events  # nothing was read
    with pytest.raises(FloatingPointError, match=r"loss is not finite \[first failed 2 batch\(es\)"):
        checks.raise_if_failed("at step 4")
    checks.raise_if_failed("at step 5")  # cleared by the read


@pytest.mark.parametrize("strict", [False, True], ids=["deferred", "strict"])
def test_a_nan_loss_still_stops_the_run(strict: bool, tmp_path: Path) -> None:
    """Default: the NaN is caught at the next read (within log_every_n_steps batches, before any checkpoint);
    ``strict_checks``: at the failing step, before the weights change."""
    model, _ = _make("CEModule", strict_checks=strict)
    poisoned: dict[str, Any] = {"n": 0}

    def poison(module: nn.Module, args: Any, output: torch.Tensor) -> torch.Tensor:
        poisoned["n"] += 1
        if poisoned["n"] != 3:
            return output
        # the third training batch: the weights after the two good steps, then a NaN loss
        poisoned["before"] = {k: v.detach().clone() for k, v in model.named_parameters()}
        return output * float("nan")

    model.head.register_forward_hook(poison)
    counter = SyncCounter()
    trainer = cpu_trainer(
        tmp_path, max_epochs=1, limit_train_batches=10, limit_val_batches=0, log_every_n_steps=LOG_EVERY, callbacks=[counter]
    )
    with pytest.raises(FloatingPointError, match="training loss is not finite.*Lower the learning rate") as info, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model, datamodule=_shapes(train_size=80))
    if strict:
        assert len(counter.train_batches) == 3 and "stopped before the weights were updated" in str(info.value)
        assert all(torch.equal(p.detach(), poisoned["before"][k]) for k, p in model.named_parameters())
    else:
        # read after batch 5 (Lightning's first logging step), the failure dated to the third batch
        assert len(counter.train_batches) == LOG_EVERY and "first failed 2 batch(es)" in str(info.value)
        assert "strict_checks" in str(info.value)
    assert not list(Path(tmp_path).rglob("*.ckpt"))


def sync_table(root: Path) -> str:
    """Markdown table of the host syncs per typical training step, per module (``python -m tests.methods.test_sync_free_step``)."""
    rows = ["| module | library syncs per typical step | sites | all syncs per typical step (Lightning's included) |", "|---|---|---|---|"]
    plain = _count(_Plain(), _shapes(train_size=8 * BATCHES), root / "plain")
    steps = plain.steps()
    rows.append(f"| plain LightningModule (one prog_bar metric) | 0 | – | {max(len(v) for v in plain.per_step(steps, None).values())} |")
    for name in sorted(MODULES):
        model, dm = _make(name)
        if name == "ReLICModule":
            torch.manual_seed(0)
            model = ReLICModule(num_classes=4, task="ordinal", **{**RELIC_ARGS, "knn_k": 3}, **SMALL)
        counter = _count(model, _data(name, dm), root / name, [CLOCMarginPlot(every_n_steps=2)] if name == "CLOCModule" else [])
        steps = counter.steps()
        lib = max(len(v) for v in counter.per_step(steps, True).values())
        total = max(len(v) for v in counter.per_step(steps, None).values())
        sites = "; ".join(sorted({e.where.split(" ")[0] + " " + e.kind for b in steps for e in counter.events.get(b, []) if e.library}))
        rows.append(f"| {name} | {lib} | {sites or '–'} | {total} |")
    return "\n".join(rows)


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        print(sync_table(Path(tmp)))
