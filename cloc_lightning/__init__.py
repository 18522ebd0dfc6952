"""cloc-lightning: contrastive learning for ordinal and general vision tasks on PyTorch Lightning."""

__version__ = "0.1.0"
