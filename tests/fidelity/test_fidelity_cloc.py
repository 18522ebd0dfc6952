"""Seed fidelity of CLOC's shipped configs (issue 14).

The CLOC README (github.com/dpitawela/CLOC, "Usage") trains in phase one with ONE
``optim.Adam(list(model.parameters()) + list(margin_criterion.parameters()))``: the
margins learn at the model's learning rate and with the model's (Adam default: no)
weight decay.  The shipped configs must give the margins the model's rate.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from cloc_lightning.methods.cloc import CLOCModule
from tests.conftest import REPO as ROOT
from tests.conftest import linked_model_args

CONFIGS = sorted(p for p in (ROOT / "configs" / "cloc").glob("*.yaml") if "phase2" not in p.name)


def _module_from_config(path: Path) -> tuple[CLOCModule, dict]:
    cfg = yaml.safe_load(path.read_text())
    args = linked_model_args(cfg)  # num_classes: the data module's, as the command line links it
    assert cfg["model"]["class_path"].endswith("CLOCModule")
    args.update(backbone="test_resnet", pretrained=False)  # same optimiser settings, tiny network
    return CLOCModule(**args), args


def seed_param_lrs(module: CLOCModule, lr: float) -> dict[int, float]:
    """The seed's optimiser: one Adam over model and margin parameters with one rate."""
    params = [p for p in module.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=lr)
    return {id(p): g["lr"] for g in opt.param_groups for p in g["params"]}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_shipped_configs_train_margins_at_the_model_rate(path: Path) -> None:
    module, args = _module_from_config(path)
    assert module.margin_parameters(), "phase-one configs must have learnable margins"
    opt = module.build_optimizer([g for g in module.param_groups() if g["params"]])
    ours = {id(p): g["lr"] for g in opt.param_groups for p in g["params"]}
    assert ours == seed_param_lrs(module, args["lr"])
    margin_wd = {g["weight_decay"] for g in opt.param_groups if g.get("name") == "margins"}
    assert margin_wd == {0.0}  # Adam's default, as the seed's optimiser


def test_margin_lr_is_still_an_explicit_choice() -> None:
    module = CLOCModule(num_classes=4, backbone="test_resnet", lr=1e-3, margin_lr=1e-2)
    groups = {g["name"]: g for g in module.param_groups()}
    assert groups["margins"]["lr"] == 1e-2 and "lr" not in groups["model"]
