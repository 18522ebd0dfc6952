"""Network building blocks: timm backbones, projection heads, probes, CLIP prompt learner."""

from cloc_lightning.nn.backbones import apply_cifar_stem, create_backbone, infer_feature_dim
from cloc_lightning.nn.heads import MLPHead
from cloc_lightning.nn.hub import PretrainedUnavailableError, load_pretrained
from cloc_lightning.nn.online_probe import OnlineLinearProbe, knn_accuracy, knn_predict

__all__ = [
    "apply_cifar_stem",
    "create_backbone",
    "infer_feature_dim",
    "MLPHead",
    "PretrainedUnavailableError",
    "load_pretrained",
    "OnlineLinearProbe",
    "knn_accuracy",
    "knn_predict",
]
