"""Ready-made models of the seed papers, built with the public DSL.

Each builder returns a :class:`fedmodel.Model`; nothing here is special-cased by the
solvers, so these double as worked examples of the DSL.
"""

from fedmodel.models.fair_vfl import VerticalModel, fair_vfl
from fedmodel.models.fairness import fairness_model
from fedmodel.models.lcqp import lcqp_instance, lcqp_model
from fedmodel.models.neyman_pearson import neyman_pearson_model

__all__ = [
    "VerticalModel",
    "fair_vfl",
    "fairness_model",
    "lcqp_instance",
    "lcqp_model",
    "neyman_pearson_model",
]
