"""Seed 002's family: vertical federated learning with a DEO fairness constraint.

* :mod:`.problem`: the vertical problem (parties' column blocks, labels, groups) and the
  score-side functions (loss, ``D``, the dual gradient (7), the weights of (8));
* :mod:`.server` / :mod:`.client`: the server and party halves of ``fair-vfl`` and
  ``fedbcd``; :mod:`.run` runs them on the common driver (``run_federated``);
* :mod:`.recognize`: a DSL model whose clients publish their partial scores -> the
  vertical problem; :mod:`.solve`: where ``solve(method=...)`` of a vertical model goes;
* :mod:`.reference`: the same model solved centrally and certified;
* :mod:`.postprocessing`: EO and calibrated EO on pooled predictions (non-federated);
* :mod:`.metrics`: accuracy, DEO (loss- and TPR-based), fairness, harmonic mean;
* :mod:`.data`: seed 002's vertical splits of Adult, COMPAS and C&C.
"""

from fedmodel.algorithms.protocol import MethodSpec
from fedmodel.algorithms.vfl.options import FairVFLOptions
from fedmodel.algorithms.vfl.problem import VerticalProblem
from fedmodel.algorithms.vfl.run import DESCRIPTIONS, run_vertical, solve_vertical


def solve_model(model, method: str, options: dict, method_spec):
    """A vertical DSL model (its clients publish their partial scores), solved with
    ``method`` (the registry's entry for ``MODEL_FAMILIES["vertical"]``, which hands in
    its ``method_spec`` lookup)."""
    from fedmodel.algorithms.vfl.solve import solve_published

    return solve_published(model, method, options, method_spec)


METHODS = {
    name: MethodSpec(FairVFLOptions, run_vertical, text, vertical=True)
    for name, text in DESCRIPTIONS.items()
}

__all__ = ["METHODS", "FairVFLOptions", "VerticalProblem", "solve_vertical"]
