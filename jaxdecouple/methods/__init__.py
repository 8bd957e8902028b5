"""Training methods, each a small configuration of an engine behind the interface in base.py."""
from jaxdecouple import config_checks
from jaxdecouple.errors import fail
from jaxdecouple.methods.adl import ADL
from jaxdecouple.methods.base import Method, Setup, classification_loss
from jaxdecouple.methods.bp import BP
from jaxdecouple.methods.ddg import DDG
from jaxdecouple.methods.dgl import DGL
from jaxdecouple.methods.dp import DP
from jaxdecouple.methods.fdg import FDG
from jaxdecouple.methods.fr import FR
from jaxdecouple.methods.replicated import Ensemble, LocalSGD, ResIST
from jaxdecouple.methods.synchronous import GPipe, OneFOneB, ZeroBubbleH1

METHODS: dict[str, type[Method]] = {m.name: m for m in (BP, DP, FDG, ADL, DDG, FR, DGL, GPipe, OneFOneB,
                                                                ZeroBubbleH1, ResIST, LocalSGD, Ensemble)}


def validate(config) -> None:
  """The whole config, before any compute: every field (``config_checks.validate``), the method's name, then the
  method's own sections (``Method.validate``). Raises ConfigError with one line naming the field."""
  config_checks.validate(config)
  if config.method not in METHODS:
    fail('method', f'{config.method!r} is not allowed; choose one of: {", ".join(sorted(METHODS))}')
  METHODS[config.method].validate(config)


__all__ = ['METHODS', 'Method', 'Setup', 'classification_loss', 'validate']
