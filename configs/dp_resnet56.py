"""DP (data parallel) on CIFAR-10 ResNet-56, the FDG paper's recipe (300 epochs), every device.

python main.py --config=configs/dp_resnet56.py --config.data.path=cifar10.npz

The batch of 128 is sharded over the devices (it must divide evenly: --config.dp.num_devices=N picks
N of them); gradients and BatchNorm statistics are averaged over all devices, so the numbers are BP's.
The FDG paper uses DP for its time comparisons.
"""
from jaxdecouple.recipes import fdg_paper


def get_config():
  return fdg_paper('dp', 'resnet56', 'cifar10')
