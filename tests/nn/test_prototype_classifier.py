"""The prototype classifier (``cloc_lightning/nn/prototype_classifier.py``): logits, predictions, its export and bad input.

The classifier is exported from a tiny open_clip CLIP's prompt learner (``tests/nn/conftest.py``).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

open_clip = pytest.importorskip("open_clip")

from cloc_lightning.nn.prompt_learner import RankPromptLearner  # noqa: E402
from cloc_lightning.nn.prototype_classifier import PrototypeClassifier  # noqa: E402
from cloc_lightning.nn.prototypes import logits_to_predictions  # noqa: E402
from tests.nn.conftest import VISION  # noqa: E402


def test_prototype_classifier_logits_predictions_and_roundtrip(tiny_clip, tok, tmp_path):
    pl = RankPromptLearner(tiny_clip, num_ranks=6, num_base_ranks=3, num_context_tokens=4, tokenizer=tok)
    visual = tiny_clip.visual
    clf = PrototypeClassifier.from_prompt_learner(
        visual,
        pl,
        logit_scale=tiny_clip.logit_scale,
        rank_values=torch.arange(6) + 16.0,
        encoder_builder={"name": "open_clip_visual", "kwargs": {"embed_dim": 24, "vision_cfg": VISION}},
    )
    assert clf.prototypes.shape == (6, 24) and not any(isinstance(m, type(pl.text_encoder)) for m in clf.modules())
    images = torch.randn(5, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = clf(images)
        f = visual(images).double().numpy()
        p = pl().double().numpy()
    cos = (f / np.linalg.norm(f, axis=1, keepdims=True)) @ (p / np.linalg.norm(p, axis=1, keepdims=True)).T
    ref = math.exp(tiny_clip.logit_scale.item()) * cos
    np.testing.assert_allclose(logits.double().numpy(), ref, rtol=1e-4, atol=1e-4)

    prob = np.exp(ref - ref.max(1, keepdims=True))
    prob /= prob.sum(1, keepdims=True)
    values = np.arange(6) + 16.0
    np.testing.assert_allclose(clf.predict(images).numpy(), prob @ values, rtol=1e-4)
    np.testing.assert_array_equal(clf.predict(images, kind="argmax").numpy(), values[ref.argmax(1)])
    with pytest.raises(ValueError, match="kind"):
        logits_to_predictions(logits, kind="median")

    # builder export: state dict + builder kwargs, loadable with weights_only=True
    path = tmp_path / "export.pt"
    clf.save(path)
    loaded = PrototypeClassifier.load(path, allow_pickle=False)
    assert loaded.image_encoder is not visual
    with torch.no_grad():
        torch.testing.assert_close(loaded(images), logits, rtol=0, atol=0)
    torch.testing.assert_close(loaded.rank_values, clf.rank_values)

    # pickled export: any module (e.g. a non-open_clip encoder)
    enc = nn.Sequential(nn.Flatten(), nn.Linear(3 * 16 * 16, 24))
    clf2 = PrototypeClassifier(enc, torch.randn(6, 24), logit_scale=math.log(50.0))
    path2 = tmp_path / "export_pickled.pt"
    clf2.save(path2)
    with pytest.raises(ValueError, match="allow_pickle"):
        PrototypeClassifier.load(path2, allow_pickle=False)
    loaded2 = PrototypeClassifier.load(path2)
    with torch.no_grad():
        torch.testing.assert_close(loaded2(images), clf2(images), rtol=0, atol=0)

    torch.save({"something": 1}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="not a PrototypeClassifier export"):
        PrototypeClassifier.load(tmp_path / "other.pt")


def test_prototype_classifier_bad_inputs():
    enc = nn.Linear(4, 3)
    with pytest.raises(ValueError, match=r"\[R, D\]"):
        PrototypeClassifier(enc, torch.randn(3), 0.0)
    with pytest.raises(ValueError, match="NaN"):
        PrototypeClassifier(enc, torch.full((2, 3), float("nan")), 0.0)
    with pytest.raises(ValueError, match="rank_values"):
        PrototypeClassifier(enc, torch.randn(2, 3), 0.0, rank_values=[1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="encoder builder"):
        PrototypeClassifier(enc, torch.randn(2, 3), 0.0, encoder_builder={"name": "nope", "kwargs": {}})
    with pytest.raises(ValueError, match="features of shape"):
        PrototypeClassifier(enc, torch.randn(2, 5), 0.0)(torch.randn(2, 4))
