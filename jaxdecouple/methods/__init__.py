"""Training methods, each a small configuration of an engine behind the interface in base.py."""
from jaxdecouple.methods.base import Method, Setup, classification_loss
from jaxdecouple.methods.bp import BP

METHODS: dict[str, type[Method]] = {m.name: m for m in (BP,)}

__all__ = ['METHODS', 'Method', 'Setup', 'classification_loss']
