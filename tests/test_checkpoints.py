"""Checkpoints, in process (the CLI paths are in ``tests/e2e/test_e2e.py``; the checkpoint callbacks in
``tests/callbacks/test_checkpoint.py``).

* A checkpoint of another module class or backbone is refused before any weight loads; a
  subclass may load its parent's checkpoint.
* The stored fixture (``tests/fixtures/make_fixtures.py``) loads strictly (its resume: ``tests/test_resume.py``);
  ``map_location`` and strict loading.
"""

from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from cloc_lightning.checkpoints import MODULE_META_KEY, CheckpointMismatchError, checkpoint_mismatch
from cloc_lightning.data import OrdinalShapesDataModule
from cloc_lightning.methods import CEModule, CLOCModule
from tests._reliability import FIXTURE_CKPT, FIXTURE_OUTPUTS, FIXTURES, SMALL, _fit, _shapes
from tests.conftest import TINY_BACKBONE, cli_env, cli_in_process, cpu_trainer, tiny_shapes

_dm = tiny_shapes  # 4 classes, 64/32/32 images, batches of 16: 4 training steps per epoch


_trainer = functools.partial(cpu_trainer, max_epochs=4, limit_train_batches=2, limit_val_batches=2)


def test_a_checkpoint_of_another_module_or_backbone_is_refused(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, max_epochs=1)
    trainer.fit(CEModule(num_classes=4, backbone=TINY_BACKBONE), datamodule=_dm())
    ce_ckpt = trainer.checkpoint_callback.last_model_path
    stored = torch.load(ce_ckpt, map_location="cpu", weights_only=False)[MODULE_META_KEY]
    assert stored["class_path"].endswith("CEModule") and stored["backbone"] == TINY_BACKBONE

    with pytest.raises(CheckpointMismatchError, match=r"written by CEModule .* configured model is CLOCModule"):
        _trainer(tmp_path).test(CLOCModule(num_classes=4, backbone=TINY_BACKBONE), datamodule=_dm(), ckpt_path=ce_ckpt)
    with pytest.raises(CheckpointMismatchError, match=r"backbone: checkpoint 'test_resnet' vs configured 'resnet18'"):
        _trainer(tmp_path).test(CEModule(num_classes=4, backbone="resnet18"), datamodule=_dm(), ckpt_path=ce_ckpt)

    class MyCE(CEModule):  # a user's subclass resumes its parent's checkpoint
        pass

    _trainer(tmp_path).test(MyCE(num_classes=4, backbone=TINY_BACKBONE), datamodule=_dm(), ckpt_path=ce_ckpt)
    # and checkpoints written before the record existed are judged by their hyper-parameters
    legacy = {"hyper_parameters": {"backbone": "resnet50"}}
    assert "resnet50" in str(checkpoint_mismatch(CEModule, {"backbone": TINY_BACKBONE}, legacy))
    assert checkpoint_mismatch(CEModule, {"backbone": TINY_BACKBONE}, {"state_dict": {}}) is None


_cli = cli_in_process


def _tiny_cli(tmp_path: Path, num_classes: int) -> list[str]:
    return [
        "--model",
        "CLOCModule",
        "--model.num_classes",
        str(num_classes),
        "--model.backbone",
        TINY_BACKBONE,
        "--data",
        "OrdinalShapesDataModule",
        "--data.num_classes",
        str(num_classes),
        "--data.image_size",
        "16",
        "--data.train_size",
        "16",
        "--data.val_size",
        "8",
        "--data.test_size",
        "8",
        "--data.batch_size",
        "8",
        "--data.num_workers",
        "0",
        "--trainer.max_epochs",
        "1",
        "--trainer.limit_train_batches",
        "1",
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.enable_model_summary",
        "false",
        "--trainer.logger.init_args.save_dir",
        str(tmp_path / "runs"),
    ]


def test_init_from_a_margins_yaml_is_one_line_naming_the_file_kind(tmp_path: Path, capsys: Any, monkeypatch: Any) -> None:
    """Issue 29 item 8: was a 50-line UnpicklingError traceback."""
    import sys

    import yaml

    monkeypatch.setattr(sys, "argv", ["cloc-lightning"])
    margins = tmp_path / "cloc_margins.yaml"
    margins.write_text(yaml.safe_dump({"learnable_map": [["fixed", 0.5]] * 3, "margin_mode": "mm"}))
    code, out, err = _cli(["fit", *_tiny_cli(tmp_path, 4), "--model.init_from", str(margins)], capsys)
    assert code == 1
    lines = [line for line in err.splitlines() if line.strip() and "Warning" not in line and not line.startswith(" ")]
    assert lines[-2].startswith(
        f"cloc-lightning: error: cannot read '{margins}' as a PyTorch checkpoint: it is a YAML file of CLOC margins"
    ), err[-2000:]
    assert "init_from takes a .ckpt file" in lines[-2] and "--model.learnable_map" in lines[-2]
    assert "Traceback" not in err and "Epoch" not in out
    # the Python API says the same, and a text file that is no YAML mapping is named as what it is
    (tmp_path / "notes.txt").write_text("not a checkpoint\n")
    with pytest.raises(ValueError, match=r"cannot read '.*notes.txt' as a PyTorch checkpoint: it is a text file"):
        CLOCModule(num_classes=4, backbone=TINY_BACKBONE).load_weights(str(tmp_path / "notes.txt"))
    with pytest.raises(FileNotFoundError, match=r"init_from checkpoint '.*missing.ckpt' does not exist; init_from takes"):
        CLOCModule(num_classes=4, backbone=TINY_BACKBONE).load_weights(str(tmp_path / "missing.ckpt"))


def test_a_checkpoint_of_another_class_count_names_which_side_said_what(tmp_path: Path, capsys: Any, monkeypatch: Any) -> None:
    """Issue 29 item 9: validate with an 8-class checkpoint under a 5-class config blamed 'model.num_classes=8'."""
    import sys

    monkeypatch.setattr(sys, "argv", ["cloc-lightning"])
    eight = CLOCModule(num_classes=8, backbone=TINY_BACKBONE)
    trainer = cpu_trainer(tmp_path)
    trainer.strategy.connect(eight)
    trainer.save_checkpoint(str(tmp_path / "eight.ckpt"))
    code, _out, err = _cli(["validate", *_tiny_cli(tmp_path, 5), "--ckpt_path", str(tmp_path / "eight.ckpt")], capsys)
    assert code == 1
    assert "the checkpoint was trained with num_classes=8, but the configured model says num_classes=5" in err, err[-2000:]
    assert "model.num_classes=8 but" not in err
    # the Python API: refused before any weight loads, both values named
    with pytest.raises(CheckpointMismatchError, match="trained with num_classes=8, but the configured model says num_classes=5"):
        cpu_trainer(tmp_path).validate(
            CLOCModule(num_classes=5, backbone=TINY_BACKBONE),
            datamodule=OrdinalShapesDataModule(num_classes=5, val_size=8, batch_size=8, num_workers=0, image_size=16),
            ckpt_path=str(tmp_path / "eight.ckpt"),
        )


# ---------------------------------------------------------------- the stored fixture, map_location, strict loading
def test_stored_fixture_loads_strictly_and_predicts_the_stored_outputs() -> None:
    """A checkpoint written by an earlier build (tests/fixtures/make_fixtures.py) keeps loading."""
    assert FIXTURE_CKPT.stat().st_size < 500 * 1024
    stored = torch.load(FIXTURE_OUTPUTS, map_location="cpu", weights_only=False)
    for location in ("cpu", torch.device("cpu"), {"cuda:0": "cpu"}, lambda storage, loc: storage):
        model = CLOCModule.load_from_checkpoint(str(FIXTURE_CKPT), map_location=location, strict=True, weights_only=False)
        model.eval()
        assert model.margins_frozen and not model.cloc_loss.learnables.requires_grad  # phase two state
        with torch.no_grad():
            torch.testing.assert_close(model(stored["images"]), stored["logits"], rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(model.embed(stored["images"]), stored["embedding"], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(model.cloc_loss.margins().detach(), stored["margins"])
        assert model.cloc_loss.to_learnable_map("fixed") == stored["learnable_map"]


def test_checkpoint_map_location_and_strict_loading(tmp_path: Path) -> None:
    """Save on CPU; load with map_location as str / torch.device / dict / callable; strict catches foreign keys;
    a float64 copy of the weights loads into the float32 module."""
    torch.manual_seed(0)
    model = CLOCModule(num_classes=4, **SMALL)
    trainer = _fit(model, _shapes(), tmp_path, limit_train_batches=2, limit_val_batches=0)
    path = tmp_path / "m.ckpt"
    trainer.save_checkpoint(str(path))
    model.eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        expected = model(x)
    for location in ("cpu", torch.device("cpu"), {"cpu": "cpu"}, lambda storage, loc: storage):
        loaded = CLOCModule.load_from_checkpoint(str(path), map_location=location, strict=True, weights_only=False).eval()
        assert all(p.device.type == "cpu" for p in loaded.parameters())
        with torch.no_grad():
            torch.testing.assert_close(loaded(x), expected, rtol=0, atol=0)
    ckpt = torch.load(path, map_location="cpu", weights_only=False)
    ckpt["state_dict"] = {k: v.double() if v.is_floating_point() else v for k, v in ckpt["state_dict"].items()}
    torch.save(ckpt, tmp_path / "f64.ckpt")
    loaded = CLOCModule.load_from_checkpoint(str(tmp_path / "f64.ckpt"), map_location="cpu", strict=True, weights_only=False)
    assert all(p.dtype == torch.float32 for p in loaded.parameters())
    with torch.no_grad():
        torch.testing.assert_close(loaded.eval()(x), expected)
    ckpt["state_dict"]["extra.weight"] = torch.zeros(1)
    torch.save(ckpt, tmp_path / "extra.ckpt")
    with pytest.raises(RuntimeError, match="Unexpected key.*extra.weight"):
        CLOCModule.load_from_checkpoint(str(tmp_path / "extra.ckpt"), strict=True, weights_only=False)
    with pytest.warns(UserWarning, match="not in the model state dict.*extra.weight"):  # strict=False: named, not fatal
        CLOCModule.load_from_checkpoint(str(tmp_path / "extra.ckpt"), strict=False, weights_only=False)


@pytest.mark.slow
def test_fixture_generator_regenerates_a_small_loadable_checkpoint(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(FIXTURES / "make_fixtures.py"), "--out", str(tmp_path)],
        cwd=tmp_path,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    ckpt = tmp_path / FIXTURE_CKPT.name
    assert ckpt.stat().st_size < 500 * 1024 and sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [FIXTURE_CKPT.name, FIXTURE_OUTPUTS.name]
    )
    model = CLOCModule.load_from_checkpoint(str(ckpt), map_location="cpu", strict=True, weights_only=False).eval()
    outputs = torch.load(tmp_path / FIXTURE_OUTPUTS.name, weights_only=False)
    with torch.no_grad():
        torch.testing.assert_close(model(outputs["images"]), outputs["logits"])
