"""Shared pieces of the ``nn`` tests: a tiny open_clip CLIP built in-process and its tokenizer.

Width 32, 2 text layers, context 24, 16 px images: the tests that use it run in seconds after
``import open_clip`` (each of those test files skips without open_clip).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

CTX_LEN = 24
VISION = dict(layers=1, width=32, head_width=16, patch_size=8, image_size=16)
TEXT = dict(context_length=CTX_LEN, vocab_size=49408, width=32, heads=2, layers=2)
TINY_CFG = {"embed_dim": 24, "vision_cfg": VISION, "text_cfg": TEXT}


def make_clip(kind: str = "clip", seed: int = 0) -> nn.Module:
    import open_clip
    from open_clip.model import CLIPTextCfg, CLIPVisionCfg

    torch.manual_seed(seed)
    if kind == "clip":
        model = open_clip.CLIP(embed_dim=24, vision_cfg=CLIPVisionCfg(**VISION), text_cfg=CLIPTextCfg(**TEXT))
    elif kind == "linear_proj":  # text_projection is an nn.Linear with bias
        model = open_clip.CLIP(embed_dim=24, vision_cfg=CLIPVisionCfg(**VISION), text_cfg=CLIPTextCfg(**TEXT, proj_bias=True))
    elif kind == "custom_text":  # text tower under model.text
        model = open_clip.CustomTextCLIP(embed_dim=24, vision_cfg=CLIPVisionCfg(**VISION), text_cfg=CLIPTextCfg(**TEXT))
    else:
        raise AssertionError(kind)
    with torch.no_grad():  # non-trivial LayerNorm affine params so ln_final placement matters
        for name, p in model.named_parameters():
            if "ln" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model.eval()


@pytest.fixture(scope="module")
def tok():
    import open_clip

    return open_clip.tokenizer.SimpleTokenizer(context_length=CTX_LEN)


@pytest.fixture(scope="module")
def tiny_clip():
    return make_clip("clip")
