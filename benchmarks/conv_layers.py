"""One 3x3 convolution layer of each CIFAR ResNet section: JAX's forward and two gradients, and PyTorch's.

  python benchmarks/conv_layers.py --batch=128
  XLA_FLAGS=--xla_cpu_experimental_ynn_fusion_type= python benchmarks/conv_layers.py   # an XLA:CPU knob

For each layer shape (32x32x16, 16x16x32, 8x8x64, and the strided 32x32x16 -> 16x16x32), times the
jitted forward, input gradient and weight gradient in JAX (median ms over --iters calls, each waiting
for its result), the threads they keep busy (process CPU time over wall time during the forward: 1.0
means one thread), and, when PyTorch is installed, PyTorch's forward and forward + backward of the same
layer (NCHW). Every layer of a shape does the same FLOPs, so GFLOP/s compare directly. Prints one JSON
line per layer, then a markdown table. Used in docs/PERFORMANCE.md ("Against PyTorch on the same CPU").
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import time

SHAPES = [(32, 16, 16, 1), (16, 32, 32, 1), (8, 64, 64, 1), (32, 16, 32, 2)]  # H=W, C in, C out, stride


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
  p.add_argument('--batch', type=int, default=128, help='batch size')
  p.add_argument('--iters', type=int, default=10, help='timed calls per measurement')
  p.add_argument('--no_torch', action='store_true', help='skip PyTorch even when installed')
  return p.parse_args(argv)


def _median_ms(fn, iters):
  fn()
  fn()
  times = []
  for _ in range(iters):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return 1e3 * statistics.median(times)


def _threads(fn, iters):
  fn()
  wall, cpu = time.perf_counter(), time.process_time()
  for _ in range(iters):
    fn()
  return (time.process_time() - cpu) / (time.perf_counter() - wall)


def jax_layer(batch, h, cin, cout, stride, iters):
  import jax
  import jax.numpy as jnp
  from jax import lax

  def conv(x, w):
    return lax.conv_general_dilated(x, w, (stride, stride), ((1, 1), (1, 1)),
                                    dimension_numbers=('NHWC', 'HWIO', 'NHWC'))
  x = jax.random.normal(jax.random.key(0), (batch, h, h, cin))
  w = 0.1 * jax.random.normal(jax.random.key(1), (3, 3, cin, cout))
  g = jnp.ones_like(jax.eval_shape(conv, x, w))
  fwd = jax.jit(conv)
  dx = jax.jit(lambda x, w, g: jax.vjp(lambda x: conv(x, w), x)[1](g)[0])
  dw = jax.jit(lambda x, w, g: jax.vjp(lambda w: conv(x, w), w)[1](g)[0])
  run = lambda f, *a: (lambda: jax.block_until_ready(f(*a)))
  return {'jax_forward_ms': _median_ms(run(fwd, x, w), iters),
          'jax_input_grad_ms': _median_ms(run(dx, x, w, g), iters),
          'jax_weight_grad_ms': _median_ms(run(dw, x, w, g), iters),
          'jax_forward_threads': round(_threads(run(fwd, x, w), iters), 2)}


def torch_layer(batch, h, cin, cout, stride, iters):
  import torch
  x = torch.randn(batch, cin, h, h, requires_grad=True)
  conv = torch.nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
  g = torch.ones_like(conv(x))

  def forward():
    with torch.no_grad():
      conv(x)

  def both():
    conv(x).backward(g)
  return {'torch_forward_ms': _median_ms(forward, iters), 'torch_forward_backward_ms': _median_ms(both, iters)}


def main(argv=None):
  args = parse_args(argv)
  use_torch = not args.no_torch and importlib.util.find_spec('torch') is not None
  rows = []
  for h, cin, cout, stride in SHAPES:
    gflop = 2 * args.batch * (h // stride) ** 2 * 9 * cin * cout / 1e9
    record = {'layer': f'{h}x{h}, {cin} -> {cout}' + (f', stride {stride}' if stride > 1 else ''),
              'batch': args.batch, 'forward_gflop': round(gflop, 4),
              **jax_layer(args.batch, h, cin, cout, stride, args.iters)}
    if use_torch:
      record.update(torch_layer(args.batch, h, cin, cout, stride, args.iters))
    record = {k: round(v, 2) if k.endswith('_ms') else v for k, v in record.items()}
    rows.append(record)
    print(json.dumps(record), flush=True)
  head = '| layer | JAX forward ms | input grad ms | weight grad ms | forward threads |'
  print('\n' + head + (' PyTorch forward ms | PyTorch fwd+bwd ms |' if use_torch else ''))
  print('|---' * (5 + 2 * use_torch) + '|')
  for r in rows:
    line = (f"| {r['layer']} | {r['jax_forward_ms']:.1f} | {r['jax_input_grad_ms']:.1f} | "
            f"{r['jax_weight_grad_ms']:.1f} | {r['jax_forward_threads']:.2f} |")
    if use_torch:
      line += f" {r['torch_forward_ms']:.1f} | {r['torch_forward_backward_ms']:.1f} |"
    print(line)
  return rows


if __name__ == '__main__':
  main()
