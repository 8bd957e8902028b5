"""Detection networks: a classification backbone whose head is replaced by YOLO-v2's detection layer, so that
ResIST's object-detection experiment (its section 5 and Table 6: "a ResNet101 backbone followed by a detection
layer (i.e., a convolution that outputs anchor box predictions)", post-activation blocks) is a chain of blocks
like every other model here, and every method trains it unchanged.

``yolo_{backbone}`` (``yolo_imagenet_postact101`` for Pascal VOC: the paper's post-activation ResNet-101 with the
ImageNet stem, stride 32, so a 416-pixel image gives YOLO-v2's 13 x 13 grid; ``yolo_postact_tiny`` for the CPU
study on the generated shapes, an 8 x 8 grid on 64 pixels) keeps the backbone's stem and residual
blocks and ends in :class:`DetectionHead`: the backbone head's BatchNorm-ReLU where it has one (pre-activation
nets), then one 1x1 convolution with A * (5 + C) outputs per cell of the last feature map (the grid). The
anchors belong to the data set (YOLO-v2 finds them by k-means over its boxes) and are kept here as fractions of
the image, so one set serves any input size and any grid: an intermediate stage's grid too, which is how DGL's
local detection heads (this same module, ``Model.aux_head``) reuse the loss.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from jaxdecouple.detection.yolo import decode, yolo_v2_loss
from jaxdecouple.models.core import Model
from jaxdecouple.models.resnet import batch_norm

PREFIX = 'yolo_'


class DetectionHead(nn.Module):
  """YOLO-v2's detection layer on a feature map: [N, G, G, A * (5 + C)] float32 predictions."""
  outputs: int
  norm: bool = False
  bn_axis: str | None = None
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, train: bool = True):
    if self.norm:
      x = nn.relu(batch_norm(train, self.bn_axis, dtype=self.dtype)(x))
    return nn.Conv(self.outputs, (1, 1), dtype=self.dtype)(x).astype(jnp.float32)


@dataclasses.dataclass(frozen=True)
class Detector:
  """What a detection network's outputs mean: its anchors (width, height as fractions of the image) and classes.
  Its ``loss`` is the YOLO-v2 loss averaged over the batch (detection/yolo.py); ``per_image`` that loss of each
  image, for the evaluator's test loss (the paper's metric); ``decode`` boxes and class scores for the mAP."""
  anchors: tuple[tuple[float, float], ...]
  num_classes: int

  def grid_anchors(self, predictions: jax.Array) -> jax.Array:
    return jnp.asarray(self.anchors, jnp.float32) * predictions.shape[1]

  def loss(self, predictions: jax.Array, labels: jax.Array) -> tuple[jax.Array, jax.Array]:
    return yolo_v2_loss(predictions, labels, self.grid_anchors(predictions), self.num_classes)

  def per_image(self, predictions: jax.Array, labels: jax.Array) -> jax.Array:
    """Each image's loss over the boxes training sees: those marked difficult (VOC's test labels keep them for
    the mAP, which ignores them) count as padding here, as training labels drop them."""
    difficult = labels[..., 5:6] > 0
    labels = jnp.where(difficult, jnp.asarray([-1, 0, 0, 0, 0, 0], labels.dtype), labels)
    one = lambda p, y: yolo_v2_loss(p[None], y[None], self.grid_anchors(predictions), self.num_classes)[0]
    return jax.vmap(one)(predictions, labels)

  def decode(self, predictions: jax.Array) -> tuple[jax.Array, jax.Array]:
    return decode(predictions, self.grid_anchors(predictions), self.num_classes)


def yolo(backbone: Model, anchors: Sequence[Sequence[float]], num_classes: int) -> Model:
  """``backbone`` with its classification head replaced by the detection layer for ``anchors`` (fractions of the
  image) and ``num_classes``."""
  anchors = tuple((float(w), float(h)) for w, h in np.asarray(anchors, np.float64).reshape(-1, 2))
  if not anchors:
    raise ValueError(f'{PREFIX}{backbone.name} needs anchors: train it on a detection data set (shapes, voc)')
  head = backbone.chain.modules[-1]
  outputs = len(anchors) * (5 + num_classes)
  detection_head = DetectionHead(outputs, norm=getattr(head, 'norm', False))
  chain = dataclasses.replace(backbone.chain, modules=(*backbone.chain.modules[:-1], detection_head))
  detector = Detector(anchors, num_classes)
  return dataclasses.replace(backbone, name=PREFIX + backbone.name, chain=chain, num_classes=num_classes,
                             aux_head=DetectionHead(outputs, norm=True), loss=detector.loss, detector=detector)
