"""Training methods, each a small configuration of an engine behind the interface in base.py."""
from jaxdecouple.methods.adl import ADL
from jaxdecouple.methods.base import Method, Setup, classification_loss
from jaxdecouple.methods.bp import BP
from jaxdecouple.methods.ddg import DDG
from jaxdecouple.methods.dgl import DGL
from jaxdecouple.methods.dp import DP
from jaxdecouple.methods.fdg import FDG
from jaxdecouple.methods.fr import FR
from jaxdecouple.methods.replicated import Ensemble, LocalSGD, ResIST

METHODS: dict[str, type[Method]] = {m.name: m for m in (BP, DP, FDG, ADL, DDG, FR, DGL, ResIST, LocalSGD, Ensemble)}

__all__ = ['METHODS', 'Method', 'Setup', 'classification_loss']
