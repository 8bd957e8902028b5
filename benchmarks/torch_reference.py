"""A plain PyTorch training step of the same CIFAR ResNet, to compare our BP images/s on one machine.

  python benchmarks/torch_reference.py --depth=56 --batch=128
  python benchmarks/torch_reference.py --depth=20 --batch=128 --device=cuda --channels_last

The network is jaxdecouple's `resnet{depth}` written again in PyTorch: He et al.'s CIFAR ResNet-(6n+2),
3x3 stem conv (16) + BN + ReLU, three sections of n post-activation basic blocks (16/32/64 channels),
option-A shortcuts (subsample, zero-pad the channels), global average pooling, a linear classifier;
no biases in convolutions, BN momentum 0.1 and epsilon 1e-5. The step: cross-entropy forward, backward,
SGD (momentum 0.9, weight decay 5e-4, lr 0.1), on a fixed synthetic CIFAR-shaped batch already on the
device (so neither side pays for input pipelines). Reports the median seconds per step over --iters
timed steps after --warmup (each synchronised), and images/s; one JSON line, then a markdown row.
PyTorch is optional: without it the script says so and exits with status 2. It uses every CPU thread
PyTorch sees by default (set --threads to compare with a JAX run pinned to fewer cores).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
  p.add_argument('--depth', type=int, default=56, help='6n+2: 20, 32, 44, 56, 110')
  p.add_argument('--batch', type=int, default=128, help='batch size')
  p.add_argument('--num_classes', type=int, default=10, help='classifier outputs')
  p.add_argument('--device', default='cpu', help='cpu or cuda')
  p.add_argument('--threads', type=int, default=0, help='torch.set_num_threads (0: PyTorch default)')
  p.add_argument('--channels_last', action='store_true', help='NHWC memory format (often faster on GPUs)')
  p.add_argument('--warmup', type=int, default=5, help='untimed steps')
  p.add_argument('--iters', type=int, default=10, help='timed steps')
  p.add_argument('--json_out', default='', help='also append the JSON line to this file')
  return p.parse_args(argv)


def build(depth: int, num_classes: int):
  import torch
  from torch import nn
  import torch.nn.functional as F

  class Block(nn.Module):
    def __init__(self, cin, cout, stride):
      super().__init__()
      self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
      self.bn1 = nn.BatchNorm2d(cout)
      self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
      self.bn2 = nn.BatchNorm2d(cout)
      self.stride, self.extra = stride, cout - cin

    def forward(self, x):
      y = F.relu(self.bn1(self.conv1(x)))
      y = self.bn2(self.conv2(y))
      if self.stride != 1 or self.extra:
        x = x[:, :, ::self.stride, ::self.stride]
        x = F.pad(x, (0, 0, 0, 0, self.extra // 2, self.extra - self.extra // 2))
      return F.relu(x + y)

  class ResNet(nn.Module):
    def __init__(self):
      super().__init__()
      if depth < 8 or (depth - 2) % 6:
        raise SystemExit(f'--depth must be 6n+2 with n >= 1, got {depth}')
      n = (depth - 2) // 6
      self.conv = nn.Conv2d(3, 16, 3, 1, 1, bias=False)
      self.bn = nn.BatchNorm2d(16)
      layers, cin = [], 16
      for s, width in enumerate((16, 32, 64)):
        for b in range(n):
          layers.append(Block(cin, width, 2 if s and b == 0 else 1))
          cin = width
      self.layers = nn.Sequential(*layers)
      self.fc = nn.Linear(64, num_classes)
      for m in self.modules():
        if isinstance(m, nn.Conv2d):
          nn.init.kaiming_normal_(m.weight, mode='fan_out', nonlinearity='relu')

    def forward(self, x):
      x = self.layers(F.relu(self.bn(self.conv(x))))
      return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))

  return ResNet()


def main(argv=None):
  args = parse_args(argv)
  try:
    import torch
  except ImportError:
    print('PyTorch is not installed; this optional reference needs it (pip install torch).', file=sys.stderr)
    return 2
  if args.threads:
    torch.set_num_threads(args.threads)
  device = torch.device(args.device)
  torch.manual_seed(0)
  model = build(args.depth, args.num_classes).to(device)
  fmt = torch.channels_last if args.channels_last else torch.contiguous_format
  model = model.to(memory_format=fmt)
  opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
  x = torch.randn(args.batch, 3, 32, 32, device=device).contiguous(memory_format=fmt)
  y = torch.randint(0, args.num_classes, (args.batch,), device=device)
  sync = torch.cuda.synchronize if device.type == 'cuda' else (lambda: None)

  def step():
    opt.zero_grad(set_to_none=True)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss

  for _ in range(args.warmup):
    step()
  sync()
  times = []
  for _ in range(args.iters):
    start = time.perf_counter()
    step().item()
    sync()
    times.append(time.perf_counter() - start)
  median = statistics.median(times)
  record = {'framework': 'pytorch', 'torch': torch.__version__, 'model': f'resnet{args.depth}',
            'params': sum(p.numel() for p in model.parameters()), 'batch': args.batch, 'device': args.device, 'threads': torch.get_num_threads(),
            'channels_last': args.channels_last, 'seconds_per_iter': round(median, 5),
            'images_per_sec': round(args.batch / median, 1)}
  if device.type == 'cuda':
    record['device_name'] = torch.cuda.get_device_name(device)
  print(json.dumps(record), flush=True)
  if args.json_out:
    with open(args.json_out, 'a', encoding='utf-8') as f:
      f.write(json.dumps(record) + '\n')
  print('\n| framework | model | batch | device | s/iter | images/s |\n|---|---|---|---|---|---|')
  print(f"| PyTorch {record['torch']} | {record['model']} | {args.batch} | {args.device} | {median:.4f} | "
        f"{record['images_per_sec']:.0f} |")
  return 0


if __name__ == '__main__':
  sys.exit(main())
