r"""Rank-N-Contrast pre-training: an encoder trained with the RnC loss on two views of every image.

K. Zha, P. Cao, J. Son, Y. Yang, D. Katabi, *Rank-N-Contrast: Learning Continuous Representations
for Regression*, NeurIPS 2023 (arXiv:2210.01189).  Reference code:
https://github.com/kaiwenzha/Rank-N-Contrast (``main_rnc.py`` for stage one, ``main_linear.py`` for
stage two, ``loss.py`` for the loss).

For a batch of ``N`` images, each seen in two augmented views ``v_1 .. v_2N`` with targets
``y``, eq. 2 of the paper is

.. math::
    \ell^{(i)} = \frac{1}{2N - 1} \sum_{j \ne i} -\log
        \frac{\exp(\mathrm{sim}(v_i, v_j)/\tau)}{\sum_{v_k \in S_{i,j}} \exp(\mathrm{sim}(v_i, v_k)/\tau)},
    \quad S_{i,j} = \{v_k : k \ne i,\ d(y_i, y_k) \ge d(y_i, y_j)\},
    \quad L_{RnC} = \frac{1}{2N} \sum_i \ell^{(i)},

so the encoder ranks the other views of the batch by their label distance: every view ``j`` is a
positive of anchor ``i`` against the views at least as far from ``i`` in label space.  ``sim`` is the
negative L2 distance of the features, ``d`` the L1 distance of the labels, ``tau = 2``.

**Protocol (two stages).**  Stage one, this module: the encoder alone (the paper uses no projection
head: the loss sees the backbone's features) trained with RnC; SGD lr 0.5, momentum 0.9, weight
decay 1e-4, cosine to ``lr * 1e-3`` over 400 epochs at batch 256 in the paper.  Stage two,
:class:`~cloc_lightning.methods.linear_regressor.LinearRegressorModule`: a linear regressor trained
with the L1 loss on the frozen encoder (``main_linear.py``: SGD lr 0.05, momentum 0.9, no weight
decay, 100 epochs).  ``cloc-lightning probe`` (scikit-learn logistic regression on frozen features)
reads this module's checkpoints too.

Example::

    cloc-lightning fit --config configs/rnc/demo.yaml                                     # stage one
    cloc-lightning fit --config configs/rnc/demo_linear.yaml \\
        --model.encoder_ckpt runs/rnc_demo/version_0/checkpoints/last.ckpt               # stage two

    model = RnCModule(backbone="resnet18", temperature=2.0)   # labels: the class index, a rank
    dm = OrdinalShapesDataModule(num_classes=6, train_views=SupConViews(n_views=2))
    L.Trainer(max_epochs=10).fit(model, datamodule=dm)
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from cloc_lightning.checks import require
from cloc_lightning.losses.rnc import FeatureSimilarity, LabelDistance, RnCLoss
from cloc_lightning.methods.optim import OptimizerName
from cloc_lightning.methods.pretrain import MultiViewModule
from cloc_lightning.validation import check_choice, check_float, check_int

__all__ = ["RnCModule"]


class RnCModule(MultiViewModule):
    """Rank-N-Contrast pre-training (Zha et al., NeurIPS 2023): :class:`~cloc_lightning.losses.RnCLoss` on multi-view batches.

    Each training batch holds ``n_views`` augmented views of every image (``data.train_views``,
    e.g. :class:`~cloc_lightning.data.SupConViews` with two views, the paper's augmentation);
    the views go through the backbone together (one forward, BatchNorm over all views), then
    the projector -- none by default, as in the paper: the loss sees the backbone features --
    and the loss sees ``[bsz, n_views, dim]`` with the targets of :meth:`rank_targets`: the class
    index as a float (the rank), or the float / vector targets of the data as they come.
    Under DDP (``gather_distributed``) every rank's views are contrasted with the global batch.

    Unlabelled images (class ``< 0``) have no rank to order them by and stop the run with an
    error naming the fix.  The online linear probe and the kNN monitor
    (:class:`~cloc_lightning.methods.pretrain.PretrainModule`) train on the detached backbone
    features of every view; float targets need ``online_probe: false`` (the probe classifies).
    Multi-view validation batches (a custom data module) log the RnC loss as ``val/loss``.

    Hooks: :meth:`build_projector`, :meth:`build_loss`, :meth:`rank_targets`.

    **Defaults** (``main_rnc.py``'s): SGD (momentum 0.9, weight decay 1e-4), lr 0.5 (at batch
    256), cosine to ``lr * 1e-3`` (its ``lr_decay_rate ** 3``), no warm-up.

    Args:
        temperature: tau > 0 of the loss (2 in the paper).
        label_distance: ``l1`` (the paper's) or ``l2`` distance of the targets.
        feature_similarity: ``l2`` (negative Euclidean distance, the paper's) or ``cosine``.
        n_views: views per image the data module must deliver (>= 2; the paper uses 2).
        projector_dim: output width of an MLP projector ``d -> hidden -> projector_dim`` between
            the backbone and the loss; ``None`` (default, the paper) = no projector.
        projector_hidden_dim: hidden width of that projector (``None`` = feature dim).
        gather_distributed: under DDP, contrast against the global batch (features all-gathered
            with gradients); a no-op on one process.
        optimizer: ``sgd`` (``main_rnc.py``'s; momentum 0.9) | ``adam`` | ``adamw`` | ``radam``.
        lr: base learning rate (``main_rnc.py``'s 0.5 at batch 256).
        weight_decay: weight decay of the default group (``main_rnc.py``'s 1e-4).
        min_lr_ratio: final cosine learning rate as a fraction of the base rate (``main_rnc.py``'s
            ``lr_decay_rate ** 3`` = 1e-3).
        **kwargs: the :class:`~cloc_lightning.methods.pretrain.PretrainModule` arguments (the online
            probe: ``num_classes``, ``task``, ``online_probe``, ``knn_k``, ...) and the
            :class:`~cloc_lightning.methods.base.BaseModule` ones (backbone, optimiser, schedule).

    Example::

        class MyRnC(RnCModule):               # targets in years: the centre of each age group
            def rank_targets(self, y):
                centres = torch.tensor([2.0, 6.0, 11.5, 20.0, 31.5, 43.0, 54.0, 70.0], device=y.device)
                return centres[y]

        model = MyRnC(backbone="resnet18", num_classes=8, task="ordinal")
    """

    #: Rank-N-Contrast trains on two views or more (fewer: only the data module is told to change)
    min_views = 2

    def __init__(
        self,
        temperature: float = 2.0,
        label_distance: LabelDistance = "l1",
        feature_similarity: FeatureSimilarity = "l2",
        n_views: int = 2,
        projector_dim: int | None = None,
        projector_hidden_dim: int | None = None,
        gather_distributed: bool = True,
        *,
        optimizer: OptimizerName = "sgd",
        lr: float = 0.5,
        weight_decay: float = 1e-4,
        min_lr_ratio: float = 1e-3,
        **kwargs: Any,
    ) -> None:
        check_float("temperature", temperature, minimum=0.0, strict_minimum=True, hint="the paper's is 2 (--model.temperature 2.0)")
        check_choice("label_distance", label_distance, LabelDistance)
        check_choice("feature_similarity", feature_similarity, FeatureSimilarity)
        check_int(
            "n_views",
            n_views,
            2,
            hint="Rank-N-Contrast contrasts two augmented views of every image (the paper's "
            "protocol): set n_views: 2 and data.train_views to SupConViews(n_views: 2)",
        )
        self.check_projector_dims(projector_dim, projector_hidden_dim, none_means="no projector (the paper)")
        super().__init__(optimizer=optimizer, lr=lr, weight_decay=weight_decay, min_lr_ratio=min_lr_ratio, **kwargs)
        self.n_views = n_views
        self.temperature = float(temperature)
        self.projector = self.build_projector()
        self.criterion = self.build_loss()

    # ------------------------------------------------------------------ hooks
    def build_projector(self) -> nn.Module:
        """Between the backbone and the loss: ``nn.Identity()`` (the paper) or ``MLPHead(d, hidden, projector_dim)``."""
        return self.mlp_projector()

    def build_loss(self) -> nn.Module:
        """The criterion on ``(features [bsz, n_views, dim], targets [bsz] or [bsz, L])``."""
        h = self.hparams
        return RnCLoss(
            temperature=self.temperature,
            label_distance=h.label_distance,
            feature_similarity=h.feature_similarity,
            gather_distributed=bool(h.gather_distributed),
        )

    def rank_targets(self, y: torch.Tensor) -> torch.Tensor:
        """The targets the loss ranks by: class indices ``[B]`` as floats; float targets ``[B]`` / ``[B, L]`` unchanged.

        Override to map classes to values of your own (e.g. the centre of each age group, so
        that label distances are in years).  Integer labels must be ``>= 0`` (checked on the
        device, read every ``log_every_n_steps``).
        """
        if y.is_floating_point():
            return y
        require(
            y >= 0,
            f"{type(self).__name__}: a training image has no label (class < 0), but Rank-N-Contrast orders "
            "images by their labels; train on labelled images only (e.g. data.split without 'unlabeled')",
        )
        return y.to(torch.float32)

    def view_targets(self, y: torch.Tensor) -> torch.Tensor:
        """The loss's targets: :meth:`rank_targets`."""
        return self.rank_targets(y)

    # -------------------------------------------------------------------- steps
    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """``{'features': [B, feature_dim], 'embedding': [B, dim]}`` (the embedding the loss sees; the features without a projector)."""
        features = self.backbone(x)
        return {"features": features, "embedding": self.projector(features)}

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """The embedding the RnC loss shapes (for plots): the projector's output, the backbone features without one."""
        embedding: torch.Tensor = self.projector(self.backbone(x))
        return embedding

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        views, y = self.split_batch(batch, expect_views=True, owner=type(self).__name__)
        if y.is_floating_point() and (self.probe is not None or self.online_eval.knn_k > 0):
            raise ValueError(
                f"{type(self).__name__}: the data's targets are floats, but the online probe and kNN monitor classify "
                "(integer classes); set model.online_probe: false and model.knn_k: 0"
            )
        with self.training_gathers():  # full batches on every process: the gathers read no sizes
            loss, feats = self.views_loss(list(views), y)
        bsz = int(y.shape[0])
        self.log("train/loss", loss, prog_bar=True, batch_size=bsz)
        if y.is_floating_point():
            return loss
        return self.add_online_eval_loss(loss, feats, y.repeat(self.n_views), batch_size=bsz)
