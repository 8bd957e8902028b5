"""For the tests: synthetic data, a few steps."""
from jaxdecouple.config import get_default_config
from jaxdecouple.study.core import Claim, Run, Study


def study() -> Study:
  def build(method):
    def b():
      c = get_default_config()
      c.method, c.model, c.dataset = method, 'resnet8', 'cifar10'
      c.data.source, c.data.synthetic_train_size, c.data.synthetic_test_size = 'synthetic', 128, 64
      c.batch_size, c.eval_batch_size, c.num_epochs, c.optim.milestones = 32, 64, 2, (1,)
      c.log_every_steps, c.checkpoint_every_steps, c.profile_every_steps = 2, 0, 0  # a checkpoint at the end
      return c
    return b
  runs = tuple(Run('ResNet-8, K=2', column, seed, build(method))
               for seed in (0, 1) for column, method in (('BP', 'bp'), ('FDG beta=1', 'fdg')))
  return Study('tiny', 'Test study', 'synthetic', '2 epochs of 4 steps', runs,
               {('ResNet-8, K=2', 'BP'): 50.0},
               claims=(Claim('FDG within 100 points of BP', 'FDG beta=1', ('ResNet-8, K=2',), 100.0),
                       Claim('FDG within -100 points of BP', 'FDG beta=1', ('ResNet-8, K=2',), -100.0)))
