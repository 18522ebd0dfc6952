"""The tutorial project (``examples/my_project``, docs/extending.md): the docs show its files as they are, and its loss
is the paper's formula.

The project itself is trained through the installed command in ``tests/e2e/test_example_project.py`` (slow).
"""

from __future__ import annotations

import re
import sys

import numpy as np
import pytest
import torch

from tests.conftest import REPO

PROJECT = REPO / "examples" / "my_project"
FILE_BLOCK = re.compile(r"<!-- file: (\S+) -->\n```\w+\n(.*?)\n```", re.S)


def tutorial_files() -> dict[str, str]:
    """``{path in the repository: the code block the tutorial shows for it}``."""
    return {path: code for path, code in FILE_BLOCK.findall((REPO / "docs" / "extending.md").read_text())}


def test_the_tutorial_shows_every_file_of_the_project_as_it_is() -> None:
    shown = tutorial_files()
    expected = {"examples/my_project/" + p for p in ("my_project/models.py", "my_project/data.py", "make_data.py", "config.yaml")}
    assert set(shown) == expected
    for path, code in shown.items():
        assert (REPO / path).read_text().rstrip() == code.rstrip(), f"docs/extending.md shows another {path} than the repository's"


def _mean_variance_reference(logits: np.ndarray, labels: np.ndarray, lm: float, lv: float) -> float:
    """Pan et al. (CVPR 2018), eq. 1-5, one sample at a time: softmax CE + lm * (m - y)^2 / 2 + lv * v, batch means."""
    total_ce = total_mean = total_var = 0.0
    for z, y in zip(logits, labels, strict=True):
        p = np.exp(z - z.max())
        p /= p.sum()
        m = sum(j * p[j] for j in range(len(p)))
        v = sum(p[j] * (j - m) ** 2 for j in range(len(p)))
        total_ce += -np.log(p[y])
        total_mean += 0.5 * (m - y) ** 2
        total_var += v
    n = len(labels)
    return total_ce / n + lm * total_mean / n + lv * total_var / n


@pytest.mark.parametrize("batch, classes", [(1, 2), (5, 4), (16, 8), (33, 101)])
def test_the_mean_variance_loss_is_the_papers_formula(batch: int, classes: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(PROJECT))
    monkeypatch.delitem(sys.modules, "my_project.models", raising=False)
    from my_project.models import MeanVarianceLoss

    g = torch.Generator().manual_seed(batch * 1000 + classes)
    logits = torch.randn(batch, classes, generator=g, dtype=torch.float64) * 3
    labels = torch.randint(0, classes, (batch,), generator=g)
    loss = MeanVarianceLoss(0.2, 0.05)
    ref = _mean_variance_reference(logits.numpy(), labels.numpy(), 0.2, 0.05)
    assert float(loss(logits, labels)) == pytest.approx(ref, rel=1e-10, abs=1e-12)
    # gradients: central differences of the reference
    x = logits.clone().requires_grad_(True)
    loss(x, labels).backward()
    eps = 1e-6
    for i, j in [(0, 0), (batch - 1, classes - 1), (batch // 2, classes // 2)]:
        up, down = logits.clone().numpy(), logits.clone().numpy()
        up[i, j] += eps
        down[i, j] -= eps
        numeric = (_mean_variance_reference(up, labels.numpy(), 0.2, 0.05) - _mean_variance_reference(down, labels.numpy(), 0.2, 0.05)) / (
            2 * eps
        )
        assert float(x.grad[i, j]) == pytest.approx(numeric, rel=1e-5, abs=1e-7)


def test_validation_scores_with_the_loss_a_subclass_trains_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """``val/loss`` of a ``CEModule`` with another ``build_loss`` is that loss (was always cross-entropy)."""
    monkeypatch.syspath_prepend(str(PROJECT))
    monkeypatch.delitem(sys.modules, "my_project.models", raising=False)
    from my_project.models import MeanVarianceLoss, MeanVarianceModule

    model = MeanVarianceModule(num_classes=4, backbone="test_resnet", lambda_mean=0.5, lambda_var=0.3).eval()
    x, y = torch.randn(6, 3, 32, 32), torch.tensor([0, 1, 2, 3, 1, 2])
    with torch.no_grad():
        loss, logits, _ = model.eval_outputs(x, y)
        assert float(loss) == pytest.approx(float(MeanVarianceLoss(0.5, 0.3)(model(x).float(), y)), rel=1e-6)
        assert float(loss) != pytest.approx(float(torch.nn.functional.cross_entropy(logits, y)), rel=1e-3)
