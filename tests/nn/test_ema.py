"""The EMA target (``cloc_lightning/nn/ema.py``), through ReLIC's online and target networks: a lerp of the
parameters and the BatchNorm buffers, integer buffers copied, ``beta`` checked."""

from __future__ import annotations

import pytest
import torch

from cloc_lightning.methods import ReLICModule
from tests.conftest import TINY_BACKBONE

QUIET = dict(online_probe=False, knn_k=0)


def test_ema_update_is_a_lerp_of_parameters_and_batchnorm_buffers() -> None:
    torch.manual_seed(0)
    m = ReLICModule(backbone=TINY_BACKBONE, **QUIET)
    online_mods = {"backbone.": m.backbone, "projector.": m.projector}
    with torch.no_grad():  # move the online network (weights AND running statistics) away from the target
        for mod in online_mods.values():
            for p in mod.parameters():
                p.add_(torch.randn_like(p))
            for b in mod.buffers():
                b.copy_(torch.rand_like(b) + 0.5) if b.is_floating_point() else b.fill_(7)
    online = {k: v.clone() for k, v in m.state_dict().items() if k.startswith(("backbone.", "projector."))}
    before = {k: v.clone() for k, v in m.state_dict().items() if k.startswith("target_")}
    m.update_target(0.9)
    after = m.state_dict()
    checked = {"weight": 0, "running_mean": 0, "running_var": 0, "num_batches_tracked": 0}
    for key, o in online.items():
        t_key = key.replace("backbone.", "target_encoder.", 1).replace("projector.", "target_projector.", 1)
        if o.is_floating_point():
            expected = 0.9 * before[t_key] + 0.1 * o  # hand-written lerp
            assert torch.allclose(after[t_key], expected, atol=1e-6), key
            assert not torch.allclose(before[t_key], after[t_key]), key
        else:
            assert torch.equal(after[t_key], o), key  # integer buffers are copied
        for name in checked:
            checked[name] += key.endswith(name)
    assert all(n > 0 for n in checked.values()), checked  # BN buffers were among the checked tensors
    m.update_target(1.0)
    assert all(torch.equal(m.state_dict()[k], v) for k, v in after.items() if k.startswith("target_"))
    m.copy_target()
    for key, o in online.items():
        t_key = key.replace("backbone.", "target_encoder.", 1).replace("projector.", "target_projector.", 1)
        assert torch.equal(m.state_dict()[t_key], o)
    assert not any(p.requires_grad for p in [*m.target_encoder.parameters(), *m.target_projector.parameters()])
    with pytest.raises(ValueError, match="beta"):
        m.update_target(1.5)
