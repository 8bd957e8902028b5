"""models/gradients.py: the convolution and dense layer whose gradients are written for XLA:CPU's loop bodies
give JAX's own gradients (within float rounding), and the convolution is replaced only inside a scan."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from jaxdecouple.models.gradients import _IN_SCAN, conv_general_dilated, dot_general, in_scan


def grads(module, variables, x):
  return jax.grad(lambda v, x: jnp.sum(jnp.sin(module.apply(v, x))), argnums=(0, 1))(variables, x)


@pytest.mark.parametrize('kernel,padding,dtype', [(3, 1, jnp.float32), (1, 0, jnp.float32), (5, 2, jnp.float32),
                                                  (3, 1, jnp.bfloat16)])
def test_the_convolution_gradient_in_a_scan_is_jaxs(kernel, padding, dtype):
  """dW as k x k products of shifted inputs, dX as a convolution with the flipped kernel: JAX's gradients."""
  ours = nn.Conv(6, (kernel, kernel), padding=padding, use_bias=False, dtype=dtype,
                 conv_general_dilated=conv_general_dilated)
  plain = nn.Conv(6, (kernel, kernel), padding=padding, use_bias=False, dtype=dtype)
  x = jax.random.normal(jax.random.key(0), (3, 7, 9, 5))
  variables = plain.init(jax.random.key(1), x)
  with in_scan():
    mine = grads(ours, variables, x)
  theirs = grads(plain, variables, x)
  tol = 2e-2 if dtype == jnp.bfloat16 else 1e-5
  for a, b in zip(jax.tree.leaves(mine), jax.tree.leaves(theirs)):
    np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), atol=tol * float(jnp.max(jnp.abs(b))))


def test_the_convolution_is_replaced_only_inside_a_scan_and_only_when_it_can_be():
  x, w = jnp.ones((2, 5, 5, 3)), jnp.ones((3, 3, 3, 4))
  dn = ('NHWC', 'HWIO', 'NHWC')
  outside = jax.make_jaxpr(lambda x, w: conv_general_dilated(x, w, (1, 1), ((1, 1), (1, 1)), dimension_numbers=dn))(x, w)
  assert 'custom_vjp' not in str(outside)
  with in_scan():
    inside = jax.make_jaxpr(lambda x, w: conv_general_dilated(x, w, (1, 1), ((1, 1), (1, 1)), dimension_numbers=dn))(x, w)
    strided = jax.make_jaxpr(lambda x, w: conv_general_dilated(x, w, (2, 2), ((1, 1), (1, 1)), dimension_numbers=dn))(x, w)
  assert 'custom_vjp' in str(inside) and 'custom_vjp' not in str(strided)
  assert not _IN_SCAN.get()


@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16])
def test_the_dense_gradient_is_jaxs(dtype):
  ours, plain = nn.Dense(7, dtype=dtype, dot_general=dot_general), nn.Dense(7, dtype=dtype)
  x = jax.random.normal(jax.random.key(0), (3, 5, 6))
  variables = plain.init(jax.random.key(1), x)
  tol = 2e-2 if dtype == jnp.bfloat16 else 1e-5
  for a, b in zip(jax.tree.leaves(grads(ours, variables, x)), jax.tree.leaves(grads(plain, variables, x))):
    np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), atol=tol * float(jnp.max(jnp.abs(b))))
