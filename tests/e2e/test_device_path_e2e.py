"""The GPU data path through the real CLI (``--data.cache memory --data.augment_on device``), as users run it.

* SupCon, SimCLR, ReLIC, CLOC (both phases in one run) and CE configs fit on one process and under
  2-process CPU DDP (gloo) with every callback firing (the checks of :func:`tests.e2e.test_e2e.check_fit`);
* a CLOC and a ReLIC (multi-crop) fit SIGKILLed mid-epoch and resumed with ``--ckpt_path last`` end bit-identical
  to an uninterrupted fit on the device path (the views are drawn from (seed, epoch, index), so the resumed run
  draws the same ones).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests._reliability import RESUME_SETUPS, _cli_config, _fit_killed_at, _last_ckpt, assert_same
from tests.conftest import CIFAR10, REPO, UTKFACE, run_cli
from tests.e2e.test_e2e import DDP, FREEZE_AT_1, Expect, check_fit, fit, needs_shared, shared_root

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

DEVICE = ["--data.cache", "memory", "--data.augment_on", "device"]

#: config, its extra arguments, what the run leaves behind, the real data it needs (None: built-in)
CASES: dict[str, tuple[str, list[str], Expect, Path | None]] = {
    "ce": ("ce/demo.yaml", ["--model.backbone", "test_resnet"], Expect(epochs=2), None),
    "cloc": (
        "cloc/demo.yaml",
        ["--model.backbone", "test_resnet", *FREEZE_AT_1, "--data.batch_size", "16"],
        Expect(epochs=3, cloc_freeze=True),
        None,
    ),
    "supcon": (
        "supcon/cifar10_cpu.yaml",
        [*shared_root(CIFAR10), "--model.backbone", "test_resnet", "--data.batch_size", "16"],
        Expect(epochs=2, tests=False, confusion=False),
        CIFAR10,
    ),
    "simclr": (
        "simclr/utkface.yaml",
        [*shared_root(UTKFACE), "--model.backbone", "test_resnet", "--data.batch_size", "16"],
        Expect(epochs=2, tests=False, confusion=False),
        UTKFACE,
    ),
    "relic": (
        "relic/demo.yaml",
        ["--data.batch_size", "16"],
        Expect(epochs=2, tests="test_after_fit" in (REPO / "configs" / "relic" / "demo.yaml").read_text(), confusion=False),
        None,
    ),
}


def _run(method: str, tmp_path: Path, *extra: str) -> None:
    config, args, expect, data = CASES[method]
    if data is not None:
        needs_shared(data)
    result = fit(config, tmp_path, *args, *DEVICE, *extra, epochs=expect.epochs, timeout=300)
    check_fit(result, tmp_path, expect)


@pytest.mark.parametrize("method", list(CASES))
def test_device_path_fits_through_the_cli(method: str, tmp_path: Path) -> None:
    _run(method, tmp_path, "--data.num_workers", "1")


@pytest.mark.ddp
@pytest.mark.parametrize("method", list(CASES))
def test_device_path_under_ddp(method: str, tmp_path: Path) -> None:
    _run(method, tmp_path, *DDP, "--trainer.strategy", "ddp")


@pytest.mark.parametrize("setup", ["cloc", "relic"])
def test_device_path_killed_and_resumed_equals_an_uninterrupted_run(setup: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base = RESUME_SETUPS[setup]
    name = f"{setup}-device"
    data = {**base["data"], "cache": "memory", "augment_on": "device"}
    if setup == "cloc":
        data["augment"] = "rrc_flip"  # a RandomResizedCrop: the views come from a fit-layout store on the device
    monkeypatch.setitem(RESUME_SETUPS, name, {**base, "data": data})
    reference_cfg = _cli_config(tmp_path, "reference", setup=name)
    assert "augment_on: device" in reference_cfg.read_text()
    run_cli(["fit", "--config", str(reference_cfg)], tmp_path, timeout=300)
    reference = torch.load(_last_ckpt(tmp_path / "runs" / "reference"), map_location="cpu", weights_only=False)
    steps = reference["global_step"]
    _fit_killed_at(tmp_path, "chain", steps // 2 + 1, resume=True, setup=name)  # SIGKILL mid-epoch (fails if never reached)
    final = run_cli(["fit", "--config", str(_cli_config(tmp_path, "chain", setup=name)), "--ckpt_path", "last"], tmp_path, timeout=300)
    assert "--ckpt_path last: resuming from" in final.stdout
    resumed = torch.load(_last_ckpt(tmp_path / "runs" / "chain"), map_location="cpu", weights_only=False)
    assert_same(resumed["state_dict"], reference["state_dict"], "state_dict")
    assert_same(resumed["optimizer_states"], reference["optimizer_states"], "optimizer_states")
    assert_same(resumed["lr_schedulers"], reference["lr_schedulers"], "lr_schedulers")
    assert (resumed["global_step"], resumed["epoch"]) == (reference["global_step"], reference["epoch"])
