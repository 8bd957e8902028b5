"""1F1B with data parallelism inside the stages: K=2 stages x D=2 devices each (4 devices), CIFAR-10 ResNet-56,
M=4 micro-batches of 32 per iteration of 128, each micro-batch split over its stage's 2 devices (BatchNorm's
statistics and the weight gradients summed over them: the numbers of D=1), the FDG paper's recipe otherwise.

python main.py --config=configs/1f1b_resnet56_k2_d2.py --config.data.path=cifar10.npz
python main.py --config=configs/1f1b_resnet56_k2_d2.py --config.data.path=cifar10.npz --config.cpu_devices=4

The first needs 4 accelerators (a host with 8: --config.pipeline.num_stages=4, or data_parallel=4); the
second splits a CPU into 4 devices (numbers, bytes and memory; no speed-up on fewer than 4 cores). With
--config.profile_every_steps=200 the log shows each stage's all-reduce bytes per iteration (read from the
compiled passes), its measured busy and idle seconds and the measured bubble.
"""
from jaxdecouple.recipes import fdg_paper


def get_config():
  c = fdg_paper('1f1b', 'resnet56', 'cifar10', num_stages=2)
  c.pipeline.micro_batches = 4
  c.pipeline.data_parallel = 2
  return c
