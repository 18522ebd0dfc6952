"""The GPU data path on a CUDA device (``pytest -m gpu``): sync-free, equal to the CPU's, and through the configs.

* The device stage (``on_after_batch_transfer``: SupCon views, ReLIC multi-crop with blur and solarize, the
  single-view pipelines, evaluation) of a pinned batch copied with ``non_blocking`` runs under
  ``torch.cuda.set_sync_debug_mode('error')``: no host sync; its views equal the same stage run on the CPU with
  the same parameters (1e-4; the kernels differ only in float rounding).
* SupCon, SimCLR, ReLIC, CLOC and CE configs fit with the GPU override set (``--data.cache memory
  --data.augment_on device``, ``bf16-mixed``) with the tier's sync check in the step; rows go to
  ``gpu_configs.{md,json}`` as the other configs' (``device path`` in the overrides column).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from cloc_lightning.data import OrdinalShapesDataModule
from cloc_lightning.data.transforms import MultiCropViews, SupConViews
from tests.gpu.conftest import CUDA, STEPS, Table, requires_gpu
from tests.gpu.test_configs import config_args, run_fit

pytestmark = [pytest.mark.gpu, pytest.mark.slow, requires_gpu]

DEVICE = ["--data.cache", "memory", "--data.augment_on", "device"]
CONFIGS = ["ce/utkface.yaml", "cloc/demo.yaml", "supcon/cifar10_cpu.yaml", "simclr/utkface.yaml", "relic/cifar10_cpu.yaml"]


def _module(**kw: Any) -> OrdinalShapesDataModule:
    dm = OrdinalShapesDataModule(
        num_classes=4,
        train_size=64,
        val_size=16,
        test_size=16,
        batch_size=32,
        image_size=64,
        num_workers=0,
        pin_memory=CUDA,
        cache="memory",
        augment_on="device",
        **kw,
    )
    dm.setup("fit")
    return dm


def _moved(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """A training batch copied to ``device`` (non-blocking); on CUDA, synchronised and then in sync-error mode until reset."""
    moved = {
        k: ({n: t.to(device, non_blocking=True) for n, t in v.items()} if isinstance(v, dict) else v.to(device, non_blocking=True))
        for k, v in batch.items()
    }
    if CUDA:
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
    return moved


@pytest.mark.parametrize("views", ["supcon", "multicrop", "rrc_flip", "crop_flip"])
def test_device_stage_is_sync_free_and_equals_the_cpu(views: str) -> None:
    kw: dict[str, Any] = {
        "supcon": {"train_views": SupConViews()},
        "multicrop": {"train_views": MultiCropViews(2, 4, blur_p=1.0)},
        "rrc_flip": {"augment": "rrc_flip"},
        "crop_flip": {"augment": "crop_flip"},
    }[views]
    dm = _module(**kw)
    raw = next(iter(dm.train_dataloader()))
    device = torch.device("cuda" if CUDA else "cpu")
    moved = _moved(raw, device)
    try:
        views_dev, _ = dm.on_after_batch_transfer(moved, 0)
        val = next(iter(dm.val_dataloader()))
        val_dev = dm.on_after_batch_transfer(tuple(t.to(device, non_blocking=True) for t in val), 0)
    finally:
        if CUDA:
            torch.cuda.set_sync_debug_mode(0)
    views_cpu, _ = dm.on_after_batch_transfer(raw, 0)
    views_dev = views_dev if isinstance(views_dev, list) else [views_dev]
    views_cpu = views_cpu if isinstance(views_cpu, list) else [views_cpu]
    for a, b in zip(views_dev, views_cpu, strict=True):
        torch.testing.assert_close(a.cpu(), b, atol=1e-4, rtol=0)
    torch.testing.assert_close(val_dev[0].cpu(), dm.on_after_batch_transfer(val, 0)[0], atol=1e-5, rtol=0)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("config", CONFIGS)
def test_config_with_the_gpu_override_set(
    config: str, data: dict[str, tuple[Path, str]], stage_one_folders: dict[str, Path], configs_table: Table, tmp_path: Path
) -> None:
    precision = "bf16-mixed"
    extra, source = config_args(config, data, stage_one_folders)
    row: dict[str, Any] = {"config": config, "precision": precision, "data": source, "overrides": "device path: " + " ".join(DEVICE)}
    try:
        result = run_fit(config, precision, [*extra, *DEVICE], tmp_path)
    except BaseException as e:
        row.update(status=f"failed: {type(e).__name__}: {str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}")
        configs_table.add(row)
        raise
    syncs = result.get("syncs", [])
    row.update({k: result.get(k) for k in ("batches", "checked_batches", "peak_alloc_mib", "peak_reserved_mib", "ms_per_step", "wall_s")})
    row.update(n_syncs=len(syncs) if result.get("checked_batches") else None, status="syncs" if syncs else "ok")
    configs_table.add(row)
    assert result["batches"] == STEPS
    losses: dict[str, float] = result.get("train_losses", {})
    assert losses and all(math.isfinite(v) for v in losses.values()), losses
    assert not syncs, f"{config} on the device path: {len(syncs)} host sync(s) in the step"


def test_the_run_seed_reaches_the_device_views_and_the_store_is_the_nodes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 49 on the GPU: ``data.seed: null`` follows ``seed_everything`` on the device path (sync-free), and
    ``data.cache: memory`` is one file in the node's shared memory that a pinned loader reads."""
    import os

    import lightning as L

    from cloc_lightning.data.stores import shm_root

    monkeypatch.setenv("CLOC_SHM_DIR", str(tmp_path / "shm"))
    device = torch.device("cuda" if CUDA else "cpu")

    def views(seed: int) -> torch.Tensor:
        os.environ.pop("PL_GLOBAL_SEED", None)
        L.seed_everything(seed, verbose=False)
        dm = _module(train_views=SupConViews())
        assert dm.train_seed == seed and Path(dm._stored["train"].folder or "").parent == shm_root()
        batch = next(iter(dm.train_dataloader()))
        moved = _moved(batch, device)
        try:
            out = dm.on_after_batch_transfer(moved, 0)[0]
        finally:
            if CUDA:
                torch.cuda.set_sync_debug_mode(0)
        return torch.cat(out).float().cpu()

    a, b, a2 = views(1), views(2), views(1)
    assert torch.equal(a, a2) and not torch.equal(a, b)
