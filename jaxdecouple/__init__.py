"""jaxdecouple: training deep networks without back-propagation's lockstep (JAX, Flax Linen)."""
__version__ = '0.1.0'
