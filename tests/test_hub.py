"""Pretrained weights through the hub (``cloc_lightning/hub.py``): unavailable offline and not cached, a clear
error at once (timm backbones and open_clip tags), no minute of hub retries."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from cloc_lightning.methods import CEModule


def test_pretrained_weights_unavailable_offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from huggingface_hub import constants

    from cloc_lightning.hub import PretrainedUnavailableError
    from cloc_lightning.nn.clip import load_clip

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf"))  # nothing cached
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    t0 = time.perf_counter()
    with pytest.raises(PretrainedUnavailableError, match="HF_HUB_OFFLINE.*pretrained: false"):
        CEModule(num_classes=4, backbone="resnet18", pretrained=True)
    with pytest.raises(PretrainedUnavailableError, match="HF_HUB_OFFLINE"):
        load_clip("RN50", "openai")
    assert time.perf_counter() - t0 < 20  # fails fast: no minute of hub retries
