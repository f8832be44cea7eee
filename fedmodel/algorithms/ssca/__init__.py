"""Seed 003's family: mini-batch SSCA for smooth non-convex federated learning, sample- and
feature-based, with and without constraints, and its SGD baselines, on a
:class:`~fedmodel.dsl.learning.LearningModel` (a per-sample loss from
:mod:`fedmodel.losses`).

* :mod:`.options`: ``SSCAOptions``, ``SGDOptions``, schedules ``a / t^alpha`` and the check
  of conditions (4), (6);
* :mod:`.surrogate`: the server's recursive surrogate state and its closed-form / slack
  problem solve (:mod:`fedmodel.subproblems.penalty_qcqp`);
* :mod:`.sample`, :mod:`.feature`: client and server halves (message tables in their
  docstrings);
* :mod:`.run`: :func:`fit`, the round loop and the ``Result``. ``docs/ssca.md``.
"""

from fedmodel.algorithms.protocol import MethodSpec
from fedmodel.algorithms.ssca.options import Schedule, SGDOptions, SSCAOptions, check_conditions
from fedmodel.algorithms.ssca.run import LEARNING_METHODS, fit


def _refuse(compiled, options, method):  # pragma: no cover - solve_model refuses first
    from fedmodel.errors import UnsupportedError

    raise UnsupportedError(f"method={method!r} trains fm.LearningModel models")


METHODS = {
    name: MethodSpec(cls, _refuse, text, learning=True)
    for name, (_, cls, text) in LEARNING_METHODS.items()
}

__all__ = ["METHODS", "SGDOptions", "SSCAOptions", "Schedule", "check_conditions", "fit"]
