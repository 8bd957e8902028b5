"""FDG's Theorem 1 (Zhuang et al., the FDG paper's section 4), checked numerically on a smooth non-convex problem.

The algorithm the theorem is about (its appendix A): K blocks q(k) of the parameters; block k (k = 1..K) steps
theta_q(k)^{t+1} = theta_q(k)^t - gamma_t beta^{K-k} g_q(k)(theta^{d_k(t)}), a stochastic gradient taken
d = 2(K-k) iterations ago (d_k(t) = t - 2(K-k)). Under Assumption 1 (L-smooth) and 2 (E||g||^2 <= M), with
a diminishing rate and L gamma_t <= 1, for every t (eq. 11):
    E[f(theta^{t+1})] - f(theta^t) <= -gamma_t / 2 Z1 + gamma_t^2 Z2,
    Z1 = sum_k beta^{K-k} ||grad_q(k) f(theta^t)||^2,
    Z2 = L M (beta^K - 1)/(beta - 1) + L M sum_k beta^{3(K-k)} (t - max{0, d_k(t)}).
The problem: f(theta) = sum_i a_i log(1 + (theta_i - c_i)^2), non-convex, L = 2 max a_i, its gradient bounded
by a_i per coordinate; the stochastic gradient adds noise uniform in [-s, s]. The expectation over the step's
noise is taken by Monte Carlo. The rate is the library's (optim.decay_steps: lr / sqrt(1 + t); the theorem's
algorithm is plain SGD, so a run meant to follow it sets optim.momentum=0, optim.weight_decay=0 and no warm-up).
The theorem asks only for a diminishing rate with L gamma_t <= 1 (not sum gamma_t^2 < inf); with 1/sqrt(t) its
averaged bound falls like log T / sqrt(T), checked below, and a constant rate, the control, does not make the norm
fall.

What is checked is eq. 11 as the paper states it, not its proof, which has two gaps (its appendix A, the bound on
P1): ||sum_j v_j||^2 <= sum_j ||v_j||^2 drops Cauchy-Schwarz's factor n = t - max{0, d} (up to 2(K - 1)), and
sum_{j=d}^{t-1} gamma_j^2 <= gamma_t^2 (t - d) needs gamma_j <= gamma_t, which a diminishing rate reverses. Eq. 11
as written holds at every step here all the same.

That the library's FDG runs this algorithm (delays 2(K-k), gradients shrunk by beta^{K-k}) is test_fdg's oracles' job;
this test is about the rate and the bound.
"""
import numpy as np
import pytest

from conftest import tiny_config
from jaxdecouple.optim import make_schedule

DIM, NOISE, SAMPLES = 12, 2.0, 4000


def problem(seed=0):
  rng = np.random.default_rng(seed)
  a, c = rng.uniform(0.5, 1.5, DIM), rng.normal(0, 2, DIM)
  f = lambda th: np.sum(a * np.log1p((th - c) ** 2), axis=-1)
  grad = lambda th: 2 * a * (th - c) / (1 + (th - c) ** 2)
  L = 2 * a.max()
  M = float(np.sum((a + NOISE) ** 2))  # ||g + noise||^2 <= sum (a_i + s)^2
  return f, grad, L, M


def rates(L, steps):
  """The library's diminishing rate, started at 1 / L (so L gamma_t <= 1 throughout)."""
  c = tiny_config()
  c.optim.learning_rate, c.optim.milestones, c.optim.decay_steps = 1.0 / L, (), 1.0
  schedule = make_schedule(c.optim, 8)
  return np.array([float(schedule(t)) for t in range(steps)])


@pytest.mark.parametrize('K', [2, 3, 4])
@pytest.mark.parametrize('beta', [1.0, 0.7])
def test_fdg_theorem_1_bounds_every_step_and_the_gradient_norm_falls(K, beta):
  f, grad, L, M = problem()
  steps = 400
  gamma = rates(L, steps)
  blocks = np.array_split(np.arange(DIM), K)  # block k = 1..K (index k - 1)
  rng = np.random.default_rng(1)
  history = [np.random.default_rng(2).normal(0, 3, DIM)]
  worst, worst_without_z2, norms = -np.inf, -np.inf, []
  for t in range(steps):
    theta = history[-1]
    full = grad(theta)
    z1 = sum(beta ** (K - k) * np.sum(full[blocks[k - 1]] ** 2) for k in range(1, K + 1))
    delay = lambda k: t - 2 * (K - k)
    geometric = K if beta == 1 else (beta ** K - 1) / (beta - 1)
    z2 = L * M * geometric + L * M * sum(beta ** (3 * (K - k)) * (t - max(0, delay(k))) for k in range(1, K + 1))
    # the step's stale block gradients (each from theta^{max(0, d)}), fresh noise: SAMPLES draws of theta^{t+1}
    step = np.zeros(DIM)
    for k in range(1, K + 1):
      q = blocks[k - 1]
      step[q] = beta ** (K - k) * grad(history[max(0, delay(k))])[q]
    noise = rng.uniform(-NOISE, NOISE, (SAMPLES, DIM)) * np.concatenate(
        [np.full(len(blocks[k - 1]), beta ** (K - k)) for k in range(1, K + 1)])
    nxt = theta - gamma[t] * (step + noise)
    expected_change = f(nxt).mean() - f(theta)
    bound = -gamma[t] / 2 * z1 + gamma[t] ** 2 * z2
    worst = max(worst, expected_change - bound)
    worst_without_z2 = max(worst_without_z2, expected_change + gamma[t] / 2 * z1)
    history.append(nxt[0])  # the trajectory goes on with one of the draws
    norms.append(np.sum(full ** 2))
  assert worst <= 1e-3, worst  # eq. 11 at every step (Monte Carlo error far below the bound's slack)
  assert worst_without_z2 > 0  # not vacuous: the descent term alone fails (the noise's gamma^2 cost), Z2 is needed
  early, late = np.mean(norms[:20]), np.mean(norms[-50:])
  assert late < 0.5 * early, (early, late)
  # The rate. Summed over t < T (f >= 0), eq. 11 bounds the gamma-weighted average of Z1 by
  # B_T = (2 f(theta^0) + 2 sum gamma_t^2 Z2_t) / sum gamma_t, which at gamma_t ~ 1/sqrt(t) falls like log T / sqrt(T)
  # (Z2_t stops growing once t passes the largest delay). On this problem B_T is vacuous in size (89 to 495 at
  # T = 400 against ||grad f||^2 <= sum a_i^2 = 14 for every theta), so what can be checked is its shape: the
  # gamma-weighted average of E||grad f(theta^t)||^2 (64 trajectories from random starts) falls like log T / sqrt(T)
  # from T = 100 to 1600, its ratio to log T / sqrt(T) flat or falling (measured 6.8 to 9.1, at most 2% above its
  # T = 100 value; 3.4% with other seeds), log-log slopes -0.27 to -0.43 per doubling against the shape's -0.30 to
  # -0.36 (a rate no slower than the bound's; seeds 3 to 5: -0.25 at the slowest), while the same algorithm
  # at the constant rate 1 / L (within L gamma <= 1, not diminishing: B_T then tends to 2 gamma Z2, not 0) stops
  # falling at the noise's floor (slopes -0.01 to 0.03, averages 6.3 to 8.0)
  horizons = np.array([100, 200, 400, 800, 1600])
  diminishing = rates(L, horizons[-1])
  weighted = mean_norms(grad, K, beta, diminishing)
  averages = np.array([np.sum(diminishing[:T] * weighted[:T]) / np.sum(diminishing[:T]) for T in horizons])
  ratios = averages / (np.log(horizons) / np.sqrt(horizons))
  slopes = np.diff(np.log(averages)) / np.diff(np.log(horizons))
  assert (ratios <= 1.1 * ratios[0]).all() and (slopes <= -0.2).all(), (ratios, slopes)
  constant = mean_norms(grad, K, beta, np.full(horizons[-1], 1.0 / L))
  flat = np.diff(np.log([np.mean(constant[:T]) for T in horizons])) / np.diff(np.log(horizons))
  assert (flat >= -0.1).all() and np.mean(constant[-200:]) > 2 * weighted[-200:].mean(), (flat, weighted[-200:].mean())


def mean_norms(grad, K, beta, gamma, trajectories=64, seed=1):
  """E||grad f(theta^t)||^2 at each t, averaged over ``trajectories`` FDG trajectories at the rates ``gamma`` (the
  test's algorithm, one noise draw a step each, each from its own start: the expectation over the start too)."""
  blocks = np.array_split(np.arange(DIM), K)
  rng = np.random.default_rng(seed)
  history, norms = [np.random.default_rng(2).normal(0, 3, (trajectories, DIM))], []
  for t, rate in enumerate(gamma):
    norms.append(np.mean(np.sum(grad(history[-1]) ** 2, axis=1)))
    step = np.zeros((trajectories, DIM))
    for k in range(1, K + 1):
      q = blocks[k - 1]
      step[:, q] = beta ** (K - k) * (grad(history[max(0, t - 2 * (K - k))])[:, q]
                                      + rng.uniform(-NOISE, NOISE, (trajectories, len(q))))
    history.append(history[-1] - rate * step)
  return np.array(norms)
