"""The prototype heads (``cloc_lightning/nn/prototypes.py``): logits against R prototypes and rank predictions.

The heads inside ``OrdinalCLIPModule`` (prompts, cache, logit-scale clamp in a fit) are covered by
``tests/methods/test_ordinal_clip_module.py``; here each piece against a NumPy reference.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from cloc_lightning.nn.prototypes import MAX_LOGIT_SCALE, LinearPrototypeHead, logits_to_predictions


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def test_logits_to_predictions_against_numpy() -> None:
    logits = torch.randn(7, 5, generator=torch.Generator().manual_seed(0))
    ref = logits.double().numpy()
    values = np.array([3.0, 5.0, 8.0, 13.0, 21.0])
    np.testing.assert_allclose(logits_to_predictions(logits).numpy(), _softmax(ref) @ np.arange(5.0), rtol=1e-5)
    np.testing.assert_allclose(
        logits_to_predictions(logits, torch.tensor(values), "expectation").numpy(), _softmax(ref) @ values, rtol=1e-5
    )
    np.testing.assert_array_equal(logits_to_predictions(logits, torch.tensor(values), "argmax").numpy(), values[ref.argmax(1)])
    with pytest.raises(ValueError, match="kind"):
        logits_to_predictions(logits, kind="median")  # type: ignore[arg-type]


def test_linear_prototype_head_logits_and_scale_clamp() -> None:
    torch.manual_seed(0)
    head = LinearPrototypeHead(num_ranks=4, embed_dim=6, logit_scale=math.log(20.0))
    feats = torch.randn(3, 6)
    with torch.no_grad():
        logits = head(feats).double().numpy()
    f, w = feats.double().numpy(), head.weight.detach().double().numpy()
    cos = (f / np.linalg.norm(f, axis=1, keepdims=True)) @ (w / np.linalg.norm(w, axis=1, keepdims=True)).T
    np.testing.assert_allclose(logits, 20.0 * cos, rtol=1e-5)
    assert "logit_scale" in dict(head.named_buffers()) and not head.learn_logit_scale

    learned = LinearPrototypeHead(num_ranks=4, embed_dim=6, logit_scale=10.0, learn_logit_scale=True)
    assert isinstance(learned.logit_scale, torch.nn.Parameter)
    assert learned.effective_logit_scale().item() == pytest.approx(MAX_LOGIT_SCALE)  # clamped at log 100, as CLIP
