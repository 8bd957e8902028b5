"""FDG K=4 on CIFAR-10 resnet56 with Muon instead of SGD, the FDG paper's schedule otherwise (300 epochs, lr / 10
at epochs 150, 225, 275, a 3-epoch warm-up at a tenth of the rate): the strongest K=4 setting of the study
cpu_cifar10_correctors, in test error, though not in gap to its own BP.

python main.py --config=configs/fdg_resnet56_k4_muon.py --config.data.path=cifar10.npz

The study (docs/RESULTS.md, CPU, ResNet-8 on CIFAR-10, 30 epochs, K=4, lr 0.02 and weight decay 0.05 as here,
neither tuned): Muon's BP 18.03% and FDG 18.52% test error (medians of 3 seeds), a gap of +0.52 points; SGD's
BP 19.40% and plain FDG 20.22% (+0.72), SGD with weight prediction 19.90% (+0.33,
configs/fdg_resnet56_k4_corrected.py). So FDG with Muon ends below SGD's BP there. Muon divides FDG's beta out
(it orthogonalises its momentum), so beta is 1 here: the delayed gradients are applied unshrunk. Muon updates
the convolution kernels and the classifier (every matrix); its Adam updates biases and BatchNorm at the same
rate. Not run at ResNet-56's 300 epochs: the rate may want tuning there.
"""
from jaxdecouple.recipes import fdg_paper


def get_config():
  c = fdg_paper('fdg', 'resnet56', 'cifar10', num_stages=4, beta=1.0, warmup=True)
  c.optim.name, c.optim.learning_rate = 'muon', 0.02
  c.optim.weight_decay, c.optim.warmup_lr = 0.05, 0.002
  return c
