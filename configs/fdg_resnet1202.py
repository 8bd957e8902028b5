"""FDG K=2 on CIFAR-10 ResNet-1202 (over 1000 layers, 19.4M parameters), the FDG paper's recipe
(300 epochs, the 3-epoch warm-up at lr 0.01 that the paper gives ResNet-110, assumed here too).

python main.py --config=configs/fdg_resnet1202.py --config.data.path=cifar10.npz

Paper (the FDG README's row of 19.4M parameters, labelled WRN-28-10 there, whose figures stand one
column off; ResNet-1202 has 19.42M parameters, WRN-28-10 36.5M): FDG 5.50% at beta 1, 5.49% at beta 0.7.
beta is the paper's best; --config.pipeline.beta=1.0 gives the no-shrinking column.
Its 600 residual blocks are three runs of identical blocks, each run as one scanned loop
(config.scan_blocks=16): start-up takes seconds instead of minutes, and since the scanned backward was
rewritten a scanned step costs what an unrolled one would (0.84x of 600/54 ResNet-110 unrolled steps on
XLA:CPU; docs/PERFORMANCE.md, "Very deep networks"). At 1.4 s a step of batch 4 on two CPU devices, 300 epochs
are still a network for accelerators.
Data: an .npz with x_train, y_train, x_test, y_test (or the JPEG-compressed CIFAR-10 copy), or
tensorflow-datasets when it can download or has the data prepared.
"""
from jaxdecouple.recipes import fdg_paper


def get_config():
  c = fdg_paper('fdg', 'resnet1202', 'cifar10', num_stages=2, beta=0.7, warmup=True)
  c.scan_blocks = 16
  return c
