"""cloc-lightning: contrastive learning for ordinal and general vision tasks on PyTorch Lightning."""

from cloc_lightning._logging import drop_lightning_tips

__version__ = "0.1.0"

drop_lightning_tips()
