"""CLOCModule, the phase-two path through the CLI, bad margin maps and phase-two margin files.

The two-phase callbacks (``CLOCMarginFreeze``, ``CLOCMarginPlot``) are tested in ``tests/callbacks/test_cloc.py``.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from cloc_lightning.callbacks import CLOCMarginFreeze
from cloc_lightning.losses.cloc import OrdinalContrastiveLoss_mm, OrdinalContrastiveLoss_sm
from cloc_lightning.methods import CLOCModule
from tests._reliability import SMALL
from tests.conftest import REPO, TINY_BACKBONE, logged_trainer, run_cli, tiny_shapes

_dm = tiny_shapes  # 4 classes, 64/32/32 images, batches of 16: 4 training steps per epoch


_trainer = functools.partial(logged_trainer, max_epochs=2)


def test_loss_choice_and_param_groups() -> None:
    m = CLOCModule(num_classes=4, backbone=TINY_BACKBONE, margin_lr=0.05, margin_weight_decay=0.0, lr=1e-3)
    assert isinstance(m.cloc_loss, OrdinalContrastiveLoss_mm)
    groups = {g["name"]: g for g in m.param_groups()}
    assert groups["margins"]["lr"] == 0.05 and groups["margins"]["params"][0] is m.cloc_loss.learnables
    assert all(p is not m.cloc_loss.learnables for p in groups["model"]["params"])
    sm = CLOCModule(num_classes=4, backbone=TINY_BACKBONE, margin_mode="sm", learnable_map=[["fixed", 0.3]])
    assert isinstance(sm.cloc_loss, OrdinalContrastiveLoss_sm)
    assert [g["name"] for g in sm.param_groups()] == ["model"]  # a fixed margin is not optimised
    feat = CLOCModule(num_classes=4, backbone=TINY_BACKBONE, cloc_on="features", projector_dim=16)
    x = torch.randn(3, 3, 32, 32)
    f = feat.backbone(x)
    assert feat.cloc_embedding(f, feat.head(f)).shape == (3, 16)


def test_training_step_is_ce_plus_weighted_cloc() -> None:
    torch.manual_seed(0)
    m = CLOCModule(num_classes=4, backbone=TINY_BACKBONE, loss_weight=0.5)
    m.eval()  # deterministic BN for recomputation
    x, y = torch.randn(8, 3, 32, 32), torch.tensor([0, 1, 2, 3, 0, 1, 2, 3])
    logits = m(x)
    expected = torch.nn.functional.cross_entropy(logits, y) + 0.5 * m.cloc_loss(logits, y)
    assert torch.allclose(m.training_step((x, y), 0), expected)


def test_training_step_logs_the_cloc_share_of_the_loss(monkeypatch) -> None:
    # issue 17: the share says whether the CLOC term acts at all (the official reduction keeps it ~1 %)
    torch.manual_seed(0)
    m = CLOCModule(num_classes=4, backbone=TINY_BACKBONE, loss_weight=0.5)
    m.eval()
    logged: dict[str, float] = {}
    monkeypatch.setattr(m, "log", lambda name, value, **kw: logged.__setitem__(name, float(value)))
    x, y = torch.randn(8, 3, 32, 32), torch.tensor([0, 1, 2, 3, 0, 1, 2, 3])
    logits = m(x)
    ce = torch.nn.functional.cross_entropy(logits, y).item()
    cloc = m.cloc_loss(logits, y).item()
    m.training_step((x, y), 0)
    assert logged["train/cloc_share"] == pytest.approx(0.5 * cloc / (ce + 0.5 * cloc), rel=1e-5)
    assert 0.0 < logged["train/cloc_share"] < 1.0


def test_checkpoints_from_before_the_record_load_frozen_at_an_unknown_time() -> None:
    """The stored fixture's ``cloc`` entry says the margins are frozen but not when (its callbacks' states said it).

    Issue 41 item 6 removed the reader of those states: the module loads frozen, ``frozen_at`` has no epoch and no
    step (the margin plot then marks no freeze).  Before, ``frozen_at`` came from ``CLOCMarginFreeze``'s state."""
    from tests._reliability import FIXTURE_CKPT

    stored = torch.load(FIXTURE_CKPT, map_location="cpu", weights_only=False)
    assert stored["cloc"]["margins_frozen"] and "frozen_at" not in stored["cloc"]
    assert stored["callbacks"]["CLOCMarginFreeze"]["frozen_at"]  # what is no longer read
    model = CLOCModule.load_from_checkpoint(str(FIXTURE_CKPT), map_location="cpu", weights_only=False)
    assert model.margins_frozen and model.cloc_loss.frozen_at == {"epoch": None, "step": None}
    assert not model.cloc_loss.learnables.requires_grad and model.margin_parameters() == []


class _OwnGroups(CLOCModule):
    """A subclass whose own param_groups keeps only the parameters with requires_grad (so, on resume, not frozen margins)."""

    def param_groups(self) -> list[dict[str, Any]]:
        return [{"name": "all", "params": [p for p in self.parameters() if p.requires_grad]}]


def test_resuming_with_an_optimiser_that_leaves_out_the_frozen_margins_is_one_line(tmp_path: Path) -> None:
    """Issue 41 item 6: frozen margins stay in the optimiser, so an own optimiser that drops them on resume is refused
    in one line naming the checkpoint and the fix (torch's own error names neither)."""
    from cloc_lightning.checkpoints import CheckpointMismatchError

    trainer = _trainer(tmp_path, callbacks=[CLOCMarginFreeze(freeze_at_epoch=1)], max_epochs=2)
    trainer.fit(_OwnGroups(num_classes=4, backbone=TINY_BACKBONE), datamodule=_dm())
    last = trainer.checkpoint_callback.last_model_path
    again = _trainer(tmp_path, callbacks=[CLOCMarginFreeze(freeze_at_epoch=1)], max_epochs=3)
    with pytest.raises(CheckpointMismatchError) as err:
        again.fit(_OwnGroups(num_classes=4, backbone=TINY_BACKBONE), datamodule=_dm(), ckpt_path=last)
    message = str(err.value)
    assert "\n" not in message and last in message and "keep self.cloc_loss.optimised_parameters()" in message


def test_wrong_length_phase_two_map_is_an_error(tmp_path: Path) -> None:
    p = tmp_path / "m.yaml"
    p.write_text(yaml.safe_dump({"learnable_map": [["fixed", 0.5], ["fixed", 0.6]]}))
    with pytest.raises(ValueError, match="3|length|entries"):
        CLOCModule(num_classes=4, backbone=TINY_BACKBONE, learnable_map=str(p))


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="margin_mode"):
        CLOCModule(num_classes=4, backbone=TINY_BACKBONE, margin_mode="xx")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cloc_on"):
        CLOCModule(num_classes=4, backbone=TINY_BACKBONE, cloc_on="pixels")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="projector_dim only applies"):
        CLOCModule(num_classes=4, backbone=TINY_BACKBONE, projector_dim=8)
    with pytest.raises(TypeError, match="CLOCModule"):
        from cloc_lightning.methods import CEModule

        _trainer(Path("."), callbacks=[CLOCMarginFreeze(1)], max_epochs=1, logger=False).fit(
            CEModule(num_classes=4, backbone=TINY_BACKBONE), datamodule=_dm()
        )


@pytest.mark.slow  # a CLI subprocess run: the long tier (pytest -m slow)
def test_two_phases_as_two_cli_runs(tmp_path: Path, tiny_shapes_args: list[str]) -> None:
    common = [*tiny_shapes_args, "--model.backbone", TINY_BACKBONE]
    out1 = run_cli(
        [
            "fit",
            "--config",
            str(REPO / "configs" / "cloc" / "demo.yaml"),
            "--model.num_classes",
            "4",
            "--trainer.callbacks.init_args.freeze_at_epoch",
            "null",
            *common,
            "--trainer.logger.init_args.name",
            "p1",
        ],
        tmp_path,
    ).stdout
    run1 = tmp_path / "runs" / "p1" / "version_0"
    margins_yaml = run1 / "cloc_margins.yaml"
    assert margins_yaml.is_file() and "test/mae" in out1
    ckpt = next((run1 / "checkpoints").glob("best-*.ckpt"))
    out2 = run_cli(
        [
            "fit",
            "--config",
            str(REPO / "configs" / "cloc" / "demo_phase2.yaml"),
            "--model.num_classes",
            "4",
            *common,
            "--model.learnable_map",
            str(margins_yaml),
            "--model.init_from",
            str(ckpt),
            "--trainer.logger.init_args.name",
            "p2",
        ],
        tmp_path,
    ).stdout
    assert "init_from" in out2 and "loaded" in out2 and "test/qwk" in out2
    ck2 = torch.load(next((tmp_path / "runs" / "p2" / "version_0" / "checkpoints").glob("last.ckpt")), weights_only=False)
    phase1 = yaml.safe_load(margins_yaml.read_text())["learnable_map"]
    assert ck2["hyper_parameters"]["learnable_map"] == phase1
    m2 = CLOCModule.load_from_checkpoint(str(tmp_path / "runs" / "p2" / "version_0" / "checkpoints" / "last.ckpt"))
    assert torch.allclose(m2.cloc_loss.margins(), torch.tensor([v for _, v in phase1]), atol=1e-6)


_USER_MODULE = '''
"""A user's own project: CLOC with their backbone, a projector and their optimiser."""
import torch
from torch import nn
from cloc_lightning.methods import CLOCModule


class MyNet(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, width, 3, stride=2, padding=1), nn.ReLU(),
                                 nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.out_dim = width

    def forward(self, x):
        return self.net(x)


class MyCLOC(CLOCModule):
    def __init__(self, num_classes: int, width: int = 12, **kwargs):
        self.width = width
        super().__init__(num_classes=num_classes, **kwargs)

    def build_backbone(self):
        net = MyNet(self.width)
        return net, net.out_dim

    def build_projector(self):
        return nn.Linear(self.feature_dim, 5)

    def build_optimizer(self, groups):
        return torch.optim.SGD(groups, lr=self.hparams.lr, momentum=0.5)
'''


@pytest.mark.slow  # a CLI subprocess run in a project folder (tests/cli/test_own_project.py covers more): the long tier (pytest -m slow)
def test_user_subclass_in_own_project_through_the_cli(tmp_path: Path, tiny_shapes_args: list[str], monkeypatch) -> None:
    """A subclass in the user's own package is selectable with --model and keeps the CLOC machinery."""
    (tmp_path / "my_project.py").write_text(_USER_MODULE)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    run_cli(
        [
            "fit",
            "--model",
            "my_project.MyCLOC",
            "--model.num_classes",
            "4",
            "--model.width",
            "10",
            "--model.cloc_on",
            "features",
            "--model.lr",
            "0.01",
            *tiny_shapes_args,
            "--trainer.logger.init_args.name",
            "user",
            "--trainer.max_epochs",
            "2",
            "--trainer.callbacks+=cloc_lightning.callbacks.CLOCMarginFreeze",
            "--trainer.callbacks.freeze_at_epoch",
            "1",
        ],
        cwd=tmp_path,
    )
    run = tmp_path / "runs" / "user" / "version_0"
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", weights_only=False)
    assert ckpt["hyper_parameters"]["width"] == 10
    assert ckpt["state_dict"]["backbone.net.0.weight"].shape[0] == 10
    assert ckpt["state_dict"]["projector.weight"].shape == (5, 10)
    assert all(g["momentum"] == 0.5 for g in ckpt["optimizer_states"][0]["param_groups"])  # the user's SGD
    margins = yaml.safe_load((run / "cloc_margins.yaml").read_text())
    assert margins["frozen_in_this_run"] is True and len(margins["learnable_map"]) == 3
    assert all(kind == "fixed" for kind, _ in margins["learnable_map"])


# ---------------------------------------------------------------- bad margin maps and phase-two margin files
@pytest.mark.parametrize(
    "margin_mode, learnable_map, error, match",
    [
        ("mm", [["fixed", 0.5], ["fixed", 0.6]], ValueError, "has 2 entries but .* needs exactly 3"),
        ("mm", [["fixed", 0.5]] * 4, ValueError, "has 4 entries but .* needs exactly 3"),
        ("sm", [["fixed", 0.5], ["fixed", 0.5]], ValueError, r"needs exactly 1"),
        ("mm", [["frozen", 0.5]] * 3, ValueError, "kind must be 'learnable' or 'fixed'"),
        ("mm", [["fixed", 0.0]] * 3, ValueError, "finite and > 0"),
        ("mm", [["learnable", -0.2]] * 3, ValueError, "finite and > 0"),
        ("mm", [["fixed", float("inf")]] * 3, ValueError, "finite and > 0"),
        ("mm", [["fixed", "0.4"]] * 3, TypeError, "quoted string in YAML"),
        ("mm", [["fixed", None]] * 3, ValueError, "'fixed' margin needs a value"),
        ("mm", ["fixed", "fixed", "fixed"], TypeError, r"must be a pair \[kind, value\]"),
        ("mm", [["fixed", 0.5, 1]] * 3, TypeError, r"must be a pair \[kind, value\]"),
        ("mm", 0.5, TypeError, "list of \\[kind, value\\] pairs"),
    ],
    ids=["short", "long", "sm-two", "kind", "zero", "negative", "inf", "yaml-string", "fixed-none", "not-pairs", "triples", "scalar"],
)
def test_malformed_learnable_map(margin_mode: str, learnable_map: Any, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        CLOCModule(num_classes=4, margin_mode=margin_mode, learnable_map=learnable_map, **SMALL)


def test_phase_two_margin_yaml_of_the_wrong_length(tmp_path: Path) -> None:
    """A margins file written for another number of classes or margin mode is refused, naming it."""
    five = tmp_path / "five_classes.yaml"  # CLOCMarginFreeze's format, from a 5-class mm run
    five.write_text(yaml.safe_dump({"learnable_map": [["fixed", 0.5]] * 4, "margin_mode": "mm", "n_classes": 5}))
    single = tmp_path / "sm.yaml"
    single.write_text(yaml.safe_dump({"learnable_map": [["fixed", 0.5]], "margin_mode": "sm"}))
    with pytest.raises(ValueError, match="has 4 entries but .*needs exactly 3.*phase-two margin YAML"):
        CLOCModule(num_classes=4, learnable_map=str(five), **SMALL)
    with pytest.raises(ValueError, match="has 1 entries but .*needs exactly 3"):
        CLOCModule(num_classes=4, learnable_map=str(single), **SMALL)
    with pytest.raises(ValueError, match="has 4 entries but OrdinalContrastiveLoss_sm"):
        CLOCModule(num_classes=4, margin_mode="sm", learnable_map=str(five), **SMALL)
    with pytest.raises(FileNotFoundError, match="CLOCMarginFreeze"):
        CLOCModule(num_classes=4, learnable_map=str(tmp_path / "typo.yaml"), **SMALL)
    (tmp_path / "other.yaml").write_text(yaml.safe_dump({"margins": [0.5, 0.5, 0.5]}))
    with pytest.raises(ValueError, match="has no 'learnable_map' key"):
        CLOCModule(num_classes=4, learnable_map=str(tmp_path / "other.yaml"), **SMALL)


def test_init_from_a_cloc_checkpoint_covers_what_evaluation_reads(tmp_path: Path) -> None:
    """Phase two's ``init_from`` skips the margins (``cloc_loss.*``): evaluation never reads them nor the projector,
    so ``test``/``predict`` with a CLOC ``init_from`` are not refused; a bare encoder state_dict leaves ``head.*`` out."""
    phase1 = CLOCModule(num_classes=4, backbone=TINY_BACKBONE, cloc_on="features", projector_dim=16)
    torch.save(phase1.state_dict(), tmp_path / "p1.pt")
    torch.save({f"backbone.{k}": v for k, v in phase1.backbone.state_dict().items()}, tmp_path / "enc.pt")
    phase2 = CLOCModule(num_classes=4, backbone=TINY_BACKBONE, cloc_on="features", projector_dim=16, learnable_map=[["fixed", 0.5]] * 3)
    keys = phase2.evaluation_keys()
    assert keys and not any(k.startswith(("cloc_loss.", "projector.")) for k in keys)
    assert any(k.startswith("head.") for k in keys)
    assert set(keys) <= set(phase2.init_from_report(str(tmp_path / "p1.pt"))["loaded"])
    missing = set(keys) - set(phase2.init_from_report(str(tmp_path / "enc.pt"))["loaded"])
    assert missing and all(k.startswith("head.") for k in missing)
