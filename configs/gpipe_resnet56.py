"""GPipe: all M forwards, then all backwards; stage k keeps all M micro-batches' activations. K=2 stages on CIFAR-10 ResNet-56, M=4 micro-batches of 32 per iteration of 128, the FDG paper's
recipe otherwise (300 epochs): the synchronous pipeline a user would run instead of FDG. Its numbers are
BP's with the gradient accumulated over the micro-batches (BatchNorm statistics per micro-batch).

python main.py --config=configs/gpipe_resnet56.py --config.data.path=cifar10.npz
python main.py --config=configs/gpipe_resnet56.py --config.data.path=cifar10.npz --config.profile_every_steps=200

The second logs, every 200 steps, each stage's measured busy and idle seconds, the measured bubble beside the
model's, and the timeline of every pass (draw it: jaxdecouple.plots.plot_timeline(workdir)).
"""
from jaxdecouple.recipes import fdg_paper


def get_config():
  c = fdg_paper('gpipe', 'resnet56', 'cifar10', num_stages=2)
  c.pipeline.micro_batches = 4
  return c
