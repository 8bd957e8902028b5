"""Model registry: ``build_model(name, num_classes)``.

Names: ``resnet{6n+2}`` (CIFAR ResNet-20/32/44/56/110, and resnet8 for quick runs), ``resnet18``,
``wrn{6n+4}_{k}`` (wrn28_10), ``preact101`` (ResIST's [3, 4, 23, 3]), ``preact152`` and ``preact200`` (its A.4
ResNet-152 and ResNet-200: [3, 4, 40, 3] and [3, 4, 56, 3]), ``preact_s3_{n}`` (its deeper or shallower variants [3, 4, n, 3]), ``postact101`` and
``postact_tiny`` (the same with post-activation blocks: ResIST's A.1), ``imagenet_resnet{18,34,50,101,152}`` and ``imagenet_preact101`` (the
ImageNet forms: 7x7 stride-2 stem and max-pool; bottlenecks from 50 on), ``preact_tiny`` ([1, 1, 6, 1], 8..64 channels, for tests and CPU studies) and
``preact_tiny_s3_{n}`` ([1, 1, n, 1], 8..64 channels: n - 1 partitioned blocks for ResIST on a CPU); transformers
(models/transformer.py): ``vit{L}_d{D}[_h{H}]_p{P}`` and ``gpt{L}_d{D}[_h{H}]_t{T}``, with ``vit_tiny``, ``vit_small``,
``gpt_tiny``, ``gpt_small`` (the 8-layer GPT of the studies) and ``gpt12``; detection (models/detection.py):
``yolo_{any image backbone}`` (``yolo_imagenet_postact101``: ResIST's section 5), with the data set's anchors;
``imagenet_postact101`` (post-activation basic blocks [3, 4, 23, 3] with the ImageNet stem) and
``postact_tiny_s3_{n}`` ([1, 1, n, 1], 8..64 channels).
"""
from __future__ import annotations

import dataclasses
import re

import jax.numpy as jnp

from jaxdecouple.detection.yolo import VOC_ANCHORS, VOC_GRID
from jaxdecouple.models.core import Chain, Model, count_params, merge, relayout, subset
from jaxdecouple.models.detection import PREFIX as DETECTION_PREFIX
from jaxdecouple.models.detection import yolo
from jaxdecouple.models.resnet import (IMAGENET_DEPTHS, AuxHead, adaptive_avg_pool, cifar_resnet, imagenet_preact_resnet,
                                      imagenet_postact_resnet, imagenet_resnet, postact_resnet, preact_resnet, resnet18, wide_resnet)
from jaxdecouple.models.transformer import HELP as TRANSFORMER_HELP
from jaxdecouple.models.transformer import build_transformer, check_input

MODEL_HELP = ('resnet{6n+2} (e.g. resnet20, resnet56, resnet110), resnet18, wrn{6n+4}_{k} (e.g. wrn28_10), '
              'preact101, preact152, preact200, preact_s3_{n}, preact_tiny, postact101, postact_tiny, preact_tiny_s3_{n}; ImageNet form (7x7 stem, max-pool): '
              'imagenet_resnet{18,34,50,101,152}, imagenet_preact101, imagenet_postact101; postact_tiny_s3_{n}; transformers: ' + TRANSFORMER_HELP +
              '; detection: yolo_{an image backbone} (e.g. yolo_imagenet_postact101, yolo_postact_tiny)')


def build_model(name: str, num_classes: int, scan_min: int = 0, dtype='float32', init: str = 'he',
                head_norm: bool = True, anchors=()) -> Model:
  """Builds a registered model; raises ValueError naming the allowed names. ``scan_min`` > 0: runs of at
  least that many identical blocks run as one scanned loop (see models/core.py). ``dtype``: the blocks'
  compute type ('float32' or 'bfloat16': activations and convolutions in bfloat16; parameters, BatchNorm
  statistics and the logits in float32). ``init``: 'he' (the modules' own) or 'torch' (PyTorch's defaults,
  models/core.py). ``head_norm`` False drops a pre-activation network's BN-ReLU before pooling (the ResIST
  release has none). ``anchors``: a ``yolo_`` network's, (width, height) as fractions of the image (the data
  set's; default YOLO-v2's VOC anchors)."""
  model = _build(name, num_classes, anchors)
  if init != 'he':
    model = dataclasses.replace(model, init_scheme=init)
  if not head_norm:
    head = model.chain.modules[-1]
    if not getattr(head, 'norm', False):
      raise ValueError(f'{name} has no BatchNorm-ReLU before its pooling to drop; leave it True (only the '
                       'pre-activation networks have one)')
    model = dataclasses.replace(model, chain=dataclasses.replace(
        model.chain, modules=(*model.chain.modules[:-1], head.clone(norm=False))))
  if scan_min:
    model = dataclasses.replace(model, chain=dataclasses.replace(model.chain, scan_min=scan_min))
  if dtype != 'float32':
    dtype = jnp.dtype(dtype)
    modules = tuple(m.clone(dtype=dtype) for m in model.chain.modules)
    model = dataclasses.replace(model, chain=dataclasses.replace(model.chain, modules=modules), dtype=dtype)
  return model


# ResIST's A.4: "identical to the original ResNet101 architecture" with "more residual blocks added to the
# third section". The paper names depth as ResNet-101 does, 3 layers per block ([3, 4, 23, 3]: 3 x 33 + 2 = 101),
# so ResNet-152 and ResNet-200 have 50 and 66 blocks, all the extra ones in the third section. Its Table 8
# agrees: local SGD's time for ResNet-200 over ResNet-152 is 1.21-1.31, blocks 66 / 50 = 1.32 (each section's
# blocks cost the same FLOPs); torchvision's third section of 36 would give both the same depth.
PAPER_DEEPER = {'preact152': 40, 'preact200': 56}
MAX_BLOCKS = 1000  # ResNet-1202 has 600; far deeper names only hang the model's construction


def _build(name: str, num_classes: int, anchors=()) -> Model:
  if name.startswith(DETECTION_PREFIX):
    backbone = name[len(DETECTION_PREFIX):]
    if backbone.startswith(('vit', 'gpt', DETECTION_PREFIX)):
      raise ValueError(f'{name}: a detection network needs a ResNet backbone (e.g. yolo_imagenet_postact101, yolo_postact_tiny)')
    anchors = anchors if len(anchors) else [(w / VOC_GRID, h / VOC_GRID) for w, h in VOC_ANCHORS]
    return yolo(_build(backbone, num_classes), anchors, num_classes)
  if (transformer := build_transformer(name, num_classes)) is not None:
    return transformer
  if (m := re.fullmatch(r'(resnet|wrn)(\d+)(_\d+)?|preact(_tiny)?_s3_(\d+)', name)) and \
      (blocks := int(m.group(2)) // 2 if m.group(2) else int(m.group(5))) > MAX_BLOCKS:
    raise ValueError(f'{name!r} has about {blocks} residual blocks; at most {MAX_BLOCKS} are supported '
                     '(resnet1202 has 600)')
  if m := re.fullmatch(r'resnet(\d+)', name):
    depth = int(m.group(1))
    if depth == 18:
      return resnet18(num_classes)
    if depth >= 8 and (depth - 2) % 6 == 0:
      return cifar_resnet(depth, num_classes)
  if m := re.fullmatch(r'wrn(\d+)_(\d+)', name):
    depth, widen = int(m.group(1)), int(m.group(2))
    if depth >= 10 and (depth - 4) % 6 == 0 and widen >= 1:
      return wide_resnet(depth, widen, num_classes)
  if m := re.fullmatch(r'imagenet_resnet(\d+)', name):
    if int(m.group(1)) in IMAGENET_DEPTHS:
      return imagenet_resnet(int(m.group(1)), num_classes)
  if name == 'imagenet_preact101':
    return imagenet_preact_resnet([3, 4, 23, 3], num_classes, name=name)
  if name == 'imagenet_postact101':  # the backbone of ResIST's detection experiment (stride 32)
    return imagenet_postact_resnet([3, 4, 23, 3], num_classes, name=name)
  if name == 'preact101':
    return preact_resnet([3, 4, 23, 3], num_classes, name=name)
  if name in PAPER_DEEPER:
    return preact_resnet([3, 4, PAPER_DEEPER[name], 3], num_classes, name=name)
  if m := re.fullmatch(r'preact_s3_(\d+)', name):
    if int(m.group(1)) >= 2:
      return preact_resnet([3, 4, int(m.group(1)), 3], num_classes, name=name)
  if name == 'postact101':  # ResIST's A.1: ResNet-101 with post-activation blocks
    return postact_resnet([3, 4, 23, 3], num_classes, name=name)
  if name == 'postact_tiny':
    return postact_resnet([1, 1, 6, 1], num_classes, widths=(8, 16, 32, 64), name=name)
  if name == 'preact_tiny':
    return preact_resnet([1, 1, 6, 1], num_classes, widths=(8, 16, 32, 64), name=name)
  if m := re.fullmatch(r'postact_tiny_s3_(\d+)', name):  # A.1's post-activation rung at the CPU studies' depth
    if int(m.group(1)) >= 2:
      return postact_resnet([1, 1, int(m.group(1)), 1], num_classes, widths=(8, 16, 32, 64), name=name)
  if m := re.fullmatch(r'preact_tiny_s3_(\d+)', name):
    if int(m.group(1)) >= 2:
      return preact_resnet([1, 1, int(m.group(1)), 1], num_classes, widths=(8, 16, 32, 64), name=name)
  raise ValueError(f'unknown model {name!r}; allowed: {MODEL_HELP}')


__all__ = ['DETECTION_PREFIX', 'check_input', 'AuxHead', 'Chain', 'Model', 'adaptive_avg_pool', 'build_model', 'count_params', 'merge', 'relayout', 'subset', 'MODEL_HELP']
