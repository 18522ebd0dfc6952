"""The command line links the data module's ``num_classes`` into the model (``cloc_lightning.data_contract``).

A config names its classes once, on the data module; a ``model.num_classes`` given anyway (config, command
line, a ``--ckpt_path`` checkpoint's hyper-parameters) must agree with the data module's, and a different one
stops before training naming both (jsonargparse alone would replace it silently).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from cloc_lightning.cli import TRAINER_DEFAULTS, CLOCLightningCLI
from cloc_lightning.data.base import BaseDataModule
from cloc_lightning.methods import CEModule
from cloc_lightning.methods.base import BaseModule
from tests.conftest import REPO, TINY_BACKBONE, cli_in_process, run_cli

CE_DEMO = str(REPO / "configs" / "ce" / "demo.yaml")
SMALL_DATA = [
    "--data.num_classes",
    "4",
    "--data.train_size",
    "16",
    "--data.val_size",
    "8",
    "--data.test_size",
    "8",
    "--data.batch_size",
    "8",
    "--data.image_size",
    "16",
    "--data.num_workers",
    "0",
]


@pytest.fixture(autouse=True)
def _in_tmp_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)  # sys.argv: tests/cli/conftest.py


def _build(args: list[str]) -> CLOCLightningCLI:
    """The real CLI, parsed and instantiated (no sub-command run)."""
    return CLOCLightningCLI(
        BaseModule,
        BaseDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        run=False,
        trainer_defaults=TRAINER_DEFAULTS,
        args=args,
    )


_main = cli_in_process


@pytest.mark.parametrize("config, outputs", [("ce/demo.yaml", 4), ("cloc/demo.yaml", 4), ("corn/demo.yaml", 3)])
def test_a_shipped_config_takes_num_classes_from_the_data_module(config: str, outputs: int) -> None:
    text = (REPO / "configs" / config).read_text()
    assert "num_classes" not in yaml.safe_load(text)["model"]["init_args"]  # named once, on the data module
    cli = _build(["--config", str(REPO / "configs" / config), "--model.backbone", TINY_BACKBONE, *SMALL_DATA])
    model = cli.model
    assert isinstance(model, CEModule.__mro__[1])  # a ClassifierModule
    assert model.num_classes == 4 and model.hparams["num_classes"] == 4
    assert model.head(torch.zeros(2, model.feature_dim)).shape == (2, outputs)  # CORN: K - 1 outputs


def test_a_pretraining_module_keeps_null_and_reads_the_data_module_at_setup() -> None:
    cli = _build(["--config", str(REPO / "configs" / "rnc" / "demo.yaml"), "--model.backbone", TINY_BACKBONE, *SMALL_DATA])
    assert cli.model.hparams["num_classes"] is None and cli.model.probe is None  # built at setup, as before


def test_a_value_that_agrees_still_works() -> None:
    cli = _build(["--config", CE_DEMO, "--model.backbone", TINY_BACKBONE, "--model.num_classes", "4", *SMALL_DATA])
    assert cli.model.num_classes == 4
    with pytest.raises(ValueError, match=r"model.num_classes=5 but OrdinalShapesDataModule has 4 classes"):
        _build(["--config", CE_DEMO, "--model.backbone", TINY_BACKBONE, "--model.num_classes", "5", *SMALL_DATA])


def test_an_old_config_with_another_count_stops_naming_both_and_the_fix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = yaml.safe_load(Path(CE_DEMO).read_text())
    old["model"]["init_args"]["num_classes"] = 6  # an old config's copy of the count ...
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(old))
    code, out, err = _main(["fit", "--config", str(tmp_path / "old.yaml"), "--model.backbone", TINY_BACKBONE, *SMALL_DATA], capsys)
    assert code == 1 and "Epoch" not in out  # ... with another --data.num_classes: refused before training
    line = [ln for ln in err.splitlines() if ln.startswith("cloc-lightning: error:")]
    assert line and "model.num_classes=6 but OrdinalShapesDataModule has 4 classes" in line[0], err[-2000:]
    assert "CEModule takes num_classes from the data module: leave model.init_args.num_classes (--model.num_classes) out" in line[0]
    assert "Traceback" not in err


def test_a_checkpoint_of_another_count_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """No ``model.num_classes`` in the config: the checkpoint's 8 (adopted by LightningCLI) against the data's 4."""
    eight = [*SMALL_DATA[:1], "8", *SMALL_DATA[2:]]
    code, _out, err = _main(
        [
            "fit",
            "--config",
            CE_DEMO,
            "--model.backbone",
            TINY_BACKBONE,
            *eight,
            "--trainer.max_steps",
            "1",
            "--trainer.limit_val_batches",
            "0",
            "--test_after_fit",
            "false",
            "--trainer.enable_progress_bar",
            "false",
            "--trainer.logger.init_args.save_dir",
            "runs",
        ],
        capsys,
    )
    assert code == 0, err[-3000:]
    ckpt = tmp_path / "runs" / "ce_demo" / "version_0" / "checkpoints" / "last.ckpt"
    args = ["validate", "--config", CE_DEMO, "--model.backbone", TINY_BACKBONE, *SMALL_DATA, "--ckpt_path", str(ckpt)]
    code, out, err = _main(args, capsys)
    assert code == 1 and "val/" not in out
    assert (f"--ckpt_path {ckpt}: the checkpoint was trained with num_classes=8, but OrdinalShapesDataModule has 4 classes") in err, err[
        -2000:
    ]


def test_fast_dev_run_of_a_config_without_num_classes(capsys: pytest.CaptureFixture[str]) -> None:
    """``--trainer.fast_dev_run`` (Lightning's DummyLogger) used to stop at 'cannot write the run folder'."""
    code, out, err = _main(
        [
            "fit",
            "--config",
            CE_DEMO,
            "--model.backbone",
            TINY_BACKBONE,
            *SMALL_DATA,
            "--trainer.fast_dev_run",
            "true",
            "--trainer.enable_progress_bar",
            "false",
        ],
        capsys,
    )
    assert code == 0, err[-3000:]
    assert "test/acc" in out and not Path("runs").exists()  # fast_dev_run logs and checkpoints nothing


@pytest.mark.slow  # a CLI subprocess run: the long tier (pytest -m slow)
def test_the_real_command_line_fits_and_validates_without_model_num_classes(tmp_path: Path) -> None:
    args = [
        "--config",
        CE_DEMO,
        "--model.backbone",
        TINY_BACKBONE,
        *SMALL_DATA,
        "--trainer.max_epochs",
        "1",
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.logger.init_args.save_dir",
        "runs",
    ]
    run_cli(["fit", *args, "--test_after_fit", "false"], tmp_path)
    run = tmp_path / "runs" / "ce_demo" / "version_0"
    ckpt: dict[str, Any] = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert ckpt["hyper_parameters"]["num_classes"] == 4 and ckpt["state_dict"]["head.weight"].shape[0] == 4
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert "num_classes" not in saved["model"]["init_args"] and saved["data"]["init_args"]["num_classes"] == 4
    out = run_cli(
        [
            "validate",
            "--config",
            str(run / "config.yaml"),
            "--ckpt_path",
            str(run / "checkpoints" / "last.ckpt"),
            "--trainer.logger",
            "false",
        ],
        tmp_path,
    ).stdout
    assert "val/mae" in out


@pytest.mark.parametrize("given", [[], ["--model.num_classes", "2"]])
def test_a_one_class_folder_is_named_by_the_data_module_first(given: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before (issue 42, item 5): "num_classes must be an integer >= 2, got 1", a setting the user never made; with
    ``--model.num_classes 2`` the advice (leave it out) led back to that error."""
    from PIL import Image

    for split in ("train", "test"):
        for i in range(3):
            (tmp_path / "one" / split / "cats").mkdir(parents=True, exist_ok=True)
            Image.new("RGB", (8, 8), (i, 0, 0)).save(tmp_path / "one" / split / "cats" / f"{i}.png")
    code, out, err = _main(
        [
            "fit",
            "--model",
            "CEModule",
            "--model.backbone",
            TINY_BACKBONE,
            *given,
            "--data",
            "ImageFolderDataModule",
            "--data.root",
            str(tmp_path / "one"),
            "--data.num_workers",
            "0",
            "--trainer.logger.init_args.save_dir",
            "runs",
        ],
        capsys,
    )
    lines = [ln for ln in err.splitlines() if ln.startswith("cloc-lightning: error:")]
    assert code == 1 and len(lines) == 1 and "Traceback" not in err and "Epoch" not in out, err[-3000:]
    line = lines[0]
    assert line.startswith("cloc-lightning: error: ImageFolderDataModule found 1 class(es) (['cats'])"), line
    assert "at least 2 are needed" in line and str(tmp_path / "one" / "train") in line, line
    assert "num_classes must be" not in line and "model.num_classes=" not in line, line
