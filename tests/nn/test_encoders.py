"""The one encoder registry (``cloc_lightning/nn/encoders.py``): the shipped builders, a builder of your own, and bad names.

Both places that rebuild an image encoder from a record go through it: the stage-one encoder of the
probes (``checkpoints.build_encoder``, ``LinearProbeModule``) with ``"timm"``, and an exported
``PrototypeClassifier`` with the builder name its file records.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from cloc_lightning.checkpoints import EncoderCheckpoint, build_encoder
from cloc_lightning.methods import LinearProbeModule
from cloc_lightning.nn import ENCODER_BUILDERS as PUBLIC_BUILDERS
from cloc_lightning.nn.backbones import create_backbone
from cloc_lightning.nn.encoders import (
    ENCODER_BUILDERS,
    ProjectedEncoder,
    build_registered_encoder,
    encoder_feature_dim,
    get_encoder_builder,
    register_encoder_builder,
)
from cloc_lightning.nn.prototype_classifier import PrototypeClassifier
from tests.conftest import TINY_BACKBONE

CUSTOM = "tests.flat_linear"


def _flat_linear(in_features: int, out_features: int) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(in_features, out_features))


@pytest.fixture
def custom_builder() -> Iterator[str]:
    """``CUSTOM`` registered for one test (and removed after it)."""
    assert register_encoder_builder(CUSTOM)(_flat_linear) is _flat_linear  # the decorator form returns the function
    try:
        yield CUSTOM
    finally:
        ENCODER_BUILDERS.pop(CUSTOM, None)


@pytest.fixture
def timm_calls(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The keyword arguments of every call of the registry's ``"timm"`` builder in one test."""
    calls: list[dict[str, Any]] = []
    original = ENCODER_BUILDERS["timm"]

    def spy(**kwargs: Any) -> nn.Module:
        calls.append(kwargs)
        return original(**kwargs)

    monkeypatch.setitem(ENCODER_BUILDERS, "timm", spy)
    return calls


def test_the_shipped_builders_are_registered_in_one_registry() -> None:
    assert {"timm", "timm_projected", "open_clip_visual"} <= set(ENCODER_BUILDERS)
    assert PUBLIC_BUILDERS is ENCODER_BUILDERS  # cloc_lightning.nn gathers the same dict, not a copy


def test_the_timm_builders_build_what_create_backbone_builds() -> None:
    torch.manual_seed(0)
    ref, width = create_backbone(TINY_BACKBONE, False, True)
    torch.manual_seed(0)
    net = build_registered_encoder("timm", backbone=TINY_BACKBONE, cifar_stem=True)
    assert type(net) is type(ref) and encoder_feature_dim(net) == width
    assert net.state_dict().keys() == ref.state_dict().keys()
    assert all(torch.equal(a, b) for a, b in zip(net.state_dict().values(), ref.state_dict().values(), strict=True))

    projected = build_registered_encoder("timm_projected", backbone=TINY_BACKBONE, embed_dim=7)
    assert isinstance(projected, ProjectedEncoder) and projected.proj.in_features == width
    assert projected(torch.randn(2, 3, 32, 32)).shape == (2, 7)
    # a module without timm's num_features: the width is found by a forward pass
    assert encoder_feature_dim(_flat_linear(3 * 32 * 32, 5)) == 5


def test_an_unknown_builder_name_is_a_clear_error() -> None:
    with pytest.raises(
        ValueError, match=r"unknown encoder builder 'nope' \(registered: \[.*'timm'.*\]\).*register_encoder_builder\('nope'"
    ):
        build_registered_encoder("nope")
    with pytest.raises(ValueError, match=r"export\.pt needs the encoder builder 'nope', which is not registered"):
        get_encoder_builder("nope", needed_by="export.pt")
    with pytest.raises(ValueError, match="unknown encoder builder"):
        get_encoder_builder(["not", "a", "name"])
    with pytest.raises(ValueError, match="non-empty string name"):
        register_encoder_builder("", _flat_linear)
    with pytest.raises(TypeError, match="must be callable"):
        register_encoder_builder("broken", 3)  # type: ignore[arg-type]
    assert "" not in ENCODER_BUILDERS and "broken" not in ENCODER_BUILDERS


def test_a_registered_builder_serves_the_prototype_export(custom_builder: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    encoder = _flat_linear(3 * 4 * 4, 6)
    record = {"name": custom_builder, "kwargs": {"in_features": 3 * 4 * 4, "out_features": 6}}
    clf = PrototypeClassifier(encoder, torch.randn(3, 6), logit_scale=math.log(10.0), encoder_builder=record)
    path = tmp_path / "custom.pt"
    clf.save(path)
    loaded = PrototypeClassifier.load(path, allow_pickle=False)  # rebuilt by the registered builder, no pickled code
    assert loaded.image_encoder is not encoder and loaded.encoder_builder == record
    images = torch.randn(4, 3, 4, 4)
    with torch.no_grad():
        torch.testing.assert_close(loaded(images), clf(images), rtol=0, atol=0)

    ENCODER_BUILDERS.pop(custom_builder)  # a file whose builder is not registered names it and the fix
    with pytest.raises(
        ValueError, match=rf"custom\.pt needs the encoder builder '{custom_builder}', which is not registered.*register_encoder_builder"
    ):
        PrototypeClassifier.load(path, allow_pickle=False)


def test_the_checkpoint_path_builds_through_the_timm_entry(timm_calls: list[dict[str, Any]]) -> None:
    net, width = create_backbone(TINY_BACKBONE)
    state = {k: torch.randn_like(v) if v.is_floating_point() else v for k, v in net.state_dict().items()}
    enc = EncoderCheckpoint(state_dict=state, backbone=TINY_BACKBONE, source="a test")
    encoder, dim = build_encoder(enc)
    assert timm_calls == [{"backbone": TINY_BACKBONE, "cifar_stem": False, "backbone_kwargs": {}}]
    assert dim == width and not encoder.training
    assert all(torch.equal(encoder.state_dict()[k], v) for k, v in state.items())

    # the linear stage rebuilds its stage-one architecture through the same entry
    LinearProbeModule(num_classes=3, encoder_info={"backbone": TINY_BACKBONE, "cifar_stem": True, "backbone_kwargs": {}})
    assert timm_calls[1] == {"backbone": TINY_BACKBONE, "cifar_stem": True, "backbone_kwargs": {}}


def test_a_builder_registered_in_place_of_timm_is_what_the_checkpoint_path_uses(monkeypatch: pytest.MonkeyPatch) -> None:
    """One place to change an encoder kind: the checkpoint path has no builder of its own."""
    monkeypatch.setitem(ENCODER_BUILDERS, "timm", lambda **kwargs: _flat_linear(3 * 32 * 32, 5))
    weights = _flat_linear(3 * 32 * 32, 5).state_dict()
    encoder, dim = build_encoder(EncoderCheckpoint(state_dict=dict(weights), backbone="anything", source="a test"))
    assert dim == 5 and isinstance(encoder, nn.Sequential)
    assert all(torch.equal(encoder.state_dict()[k], v) for k, v in weights.items())
