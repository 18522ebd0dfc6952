"""Offline-safe CLIP loading (``cloc_lightning/nn/clip.py``): unknown names, random and local weights, a tag that is
not cached while offline or with the hub unreachable (fast, clear errors), a cached tag without network.
"""

from __future__ import annotations

import os

import pytest
import torch

open_clip = pytest.importorskip("open_clip")

from cloc_lightning import hub  # noqa: E402
from cloc_lightning.hub import PretrainedUnavailableError  # noqa: E402
from cloc_lightning.nn.clip import load_clip  # noqa: E402
from tests.nn.conftest import CTX_LEN, TINY_CFG  # noqa: E402


@pytest.fixture
def tiny_registered(monkeypatch, tmp_path):
    """Register a tiny open_clip config and a fake pretrained tag, with nothing cached."""
    import open_clip.factory as factory
    import open_clip.pretrained as pretrained

    monkeypatch.setitem(factory._MODEL_CONFIGS, "cloc-test-tiny", TINY_CFG)
    monkeypatch.setitem(pretrained._PRETRAINED, "cloc-test-tiny", {"fake": {"hf_hub": "cloc-test/tiny-fake/"}})

    def no_download(*a, **k):  # any hub download attempt would be a failure of the fast path
        raise AssertionError("hf_hub_download must not be called")

    monkeypatch.setattr(pretrained, "hf_hub_download", no_download)
    return tmp_path / "hub"


def test_load_clip_unknown_name():
    with pytest.raises(ValueError, match="ViT-B-32") as info:
        load_clip("ViT-B32", pretrained=None)
    assert "Unknown open_clip model name" in str(info.value)


def test_load_clip_random_and_local_path(tiny_registered, tmp_path):
    model, tokenizer = load_clip("cloc-test-tiny", pretrained=None)
    assert isinstance(model, open_clip.CLIP) and tokenizer.context_length == CTX_LEN
    ckpt = tmp_path / "weights.pt"
    torch.save(model.state_dict(), ckpt)
    model2, _ = load_clip("cloc-test-tiny", pretrained=str(ckpt))
    for (k, a), (_, b) in zip(model.state_dict().items(), model2.state_dict().items(), strict=True):
        assert torch.equal(a, b), k
    with pytest.raises(ValueError, match="neither a known open_clip tag"):
        load_clip("cloc-test-tiny", pretrained=str(tmp_path / "missing.pt"))
    with pytest.raises(ValueError, match="precision"):
        load_clip("cloc-test-tiny", pretrained=None, precision="fp8")


def test_load_clip_offline_uncached_tag_fails_fast(tiny_registered, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(PretrainedUnavailableError, match="pretrained: null") as info:
        load_clip("cloc-test-tiny", pretrained="fake", cache_dir=str(tiny_registered))
    assert "HF_HUB_OFFLINE" in str(info.value)


def test_load_clip_unreachable_hub_fails_fast(tiny_registered, monkeypatch):
    """Not offline but the hub cannot be reached: one short probe, then a clear error (no retries)."""
    import huggingface_hub.constants as hfc

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(hfc, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hfc, "ENDPOINT", "http://127.0.0.1:9")  # discard port: connection refused
    monkeypatch.setattr(hub, "HUB_PROBE_TIMEOUT_S", 1.0)
    with pytest.raises(PretrainedUnavailableError, match="cannot be reached"):
        load_clip("cloc-test-tiny", pretrained="fake", cache_dir=str(tiny_registered))


def test_load_clip_cached_tag_loads_without_network(tiny_registered, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    ref, _ = load_clip("cloc-test-tiny", pretrained=None)
    snap = tiny_registered / "models--cloc-test--tiny-fake" / "snapshots" / ("0" * 40)
    snap.mkdir(parents=True)
    torch.save(ref.state_dict(), snap / "open_clip_pytorch_model.bin")
    (tiny_registered / "models--cloc-test--tiny-fake" / "refs").mkdir()
    (tiny_registered / "models--cloc-test--tiny-fake" / "refs" / "main").write_text("0" * 40)
    model, _ = load_clip("cloc-test-tiny", pretrained="fake", cache_dir=str(tiny_registered))
    for (k, a), (_, b) in zip(ref.state_dict().items(), model.state_dict().items(), strict=True):
        assert torch.equal(a, b), k
    assert os.environ["HF_HUB_OFFLINE"] == "1"
