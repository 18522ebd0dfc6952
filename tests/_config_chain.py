"""Which shipped config is fed by another's run folder: one declaration for the e2e and GPU tiers.

A phase-two CLOC config reads phase one's ``cloc_margins.yaml`` and checkpoint; a linear
stage reads its stage one's checkpoint (``encoder_ckpt``).  The acceptance tiers run the
feeding config first and hand its outputs on; ``tests/test_config_chain.py`` checks that every
config that takes such an input is listed here.
"""

from __future__ import annotations

#: ``{config: the config whose run folder feeds it}`` (paths relative to ``configs/``)
FED_BY: dict[str, str] = {
    "cloc/demo_phase2.yaml": "cloc/demo.yaml",
    "cloc/utkface_phase2.yaml": "cloc/utkface.yaml",
    "linear_probe/cifar10.yaml": "supcon/cifar10.yaml",
    "linear_probe/cifar10_cpu.yaml": "supcon/cifar10_cpu.yaml",
    "linear_probe/probe_cifar10_cpu.yaml": "supcon/cifar10_cpu.yaml",
    "rnc/demo_linear.yaml": "rnc/demo.yaml",
    "rnc/utkface_linear.yaml": "rnc/utkface.yaml",
}

#: the model arguments through which a ``fit`` config is fed by another's run folder (phase two's
#: ``learnable_map`` comes with its ``init_from``)
FEED_ARGUMENTS = ("init_from", "encoder_ckpt")
#: configs of ``cloc-lightning probe``, which takes the checkpoint on its command line (``--ckpt``)
PROBE_CONFIGS = {"linear_probe/probe_cifar10_cpu.yaml"}
