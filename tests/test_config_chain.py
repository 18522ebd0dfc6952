"""The config chain of ``tests/_config_chain.py`` matches the shipped configs."""

from __future__ import annotations

from typing import Any

import yaml

from tests._config_chain import FED_BY, FEED_ARGUMENTS, PROBE_CONFIGS
from tests.conftest import REPO

CONFIGS = REPO / "configs"


def _model_args(cfg: dict[str, Any]) -> dict[str, Any]:
    model = cfg.get("model") or {}
    return dict(model.get("init_args") or {}) if isinstance(model, dict) else {}


def test_every_fed_config_is_declared_and_every_declared_one_exists() -> None:
    shipped = {p.relative_to(CONFIGS).as_posix(): yaml.safe_load(p.read_text()) or {} for p in CONFIGS.rglob("*.yaml")}
    fed = {name for name, cfg in shipped.items() if any(a in _model_args(cfg) for a in FEED_ARGUMENTS)} | PROBE_CONFIGS
    assert fed, "no shipped config takes a feed argument: FEED_ARGUMENTS is out of date"
    assert fed - set(FED_BY) == set(), "configs fed by another's run folder but missing from tests/_config_chain.FED_BY"
    assert {*FED_BY, *FED_BY.values()} <= set(shipped), "FED_BY names configs that are not shipped"
    assert not set(FED_BY.values()) & set(FED_BY), "a feeding config is itself fed: the tiers run feeders first, once"
