"""The certificate charges the complementarity of the user's constraints as the gap it
leaves (certificate/kkt.py: ``sum_j mu_j [-c_j]_+ + sum_k |nu_k a_k|`` relative to the
objective's size), not only Definition 1's per-row residual relative to the row's scale."""

from __future__ import annotations

import numpy as np

import fedmodel as fm
from fedmodel.algorithms.centralized.cprox_al import pooled_evaluation


def _lp():
    """``min x0 - x1`` with ``x0 >= -1000`` and ``x1 <= -1000`` (a client's rows): the
    optimum is ``(-1000, -1000)``, objective 0, both rows active with multiplier 1."""
    m = fm.Model("lp-far-sides")
    x = m.variable(2, name="x")
    m.server.minimize(x[0] - x[1])
    c = m.client("c")
    c.subject_to(x[0] >= -1000)
    c.subject_to(x[1] <= -1000)
    return m


def _certificate(m, point, mu, nu=0.0):
    compiled = m.compile()
    mus = [np.full(p.m_ineq, mu) for p in compiled.parties]
    nus = [np.full(p.m_eq, nu) for p in compiled.parties]
    return pooled_evaluation(compiled, np.asarray(point, dtype=float), mus, nus)


def test_a_multiplier_on_an_inactive_row_is_charged_its_gap():
    """At ``x0 = -999.5`` the row ``x0 >= -1000`` has slack 0.5, 5e-4 of its constant, so
    Definition 1's residual relative to the row passes ``eps = 1e-3``; its multiplier 1
    makes the point exactly stationary, but the objective is 0.5 above the optimum 0 on an
    objective of size 1: the gap ``mu_j |c_j| = 0.5`` is charged, no certificate."""
    m = _lp()
    kkt, summary = _certificate(m, [-999.5, -1000.0], 1.0)
    assert kkt.scaled_stationarity == 0.0
    assert summary["objective"] == 0.5
    assert kkt.scaled_feasibility >= 0.5 - 1e-12
    assert not kkt.satisfied(1e-3, 1e-3)
    # the optimum with the same multipliers is certified exactly
    kkt, _ = _certificate(m, [-1000.0, -1000.0], 1.0)
    assert kkt.satisfied(1e-12, 1e-12), kkt
    res = m.solve("centralized", eps=1e-6)
    assert res.status == "optimal" and abs(res.objective) <= 1e-6


def test_an_equality_multiplier_times_its_residual_is_charged():
    """``min x0 - x1`` with ``x0 + x1 == 2000`` and ``x1 <= 1000``: optimum ``(1000, 1000)``,
    objective 0, ``nu = -1``, ``mu = 2``. At ``(1001, 1000)`` the equality is off by 1, 5e-4
    of its constant, and those multipliers are exactly stationary; the objective is 1 above
    the optimum on an objective of size 1: ``|nu a| = 1`` is charged."""
    m = fm.Model("eq-far-side")
    x = m.variable(2, name="x")
    m.server.minimize(x[0] - x[1])
    c = m.client("c")
    c.subject_to(x[0] + x[1] == 2000)
    c.subject_to(x[1] <= 1000)
    kkt, summary = _certificate(m, [1001.0, 1000.0], 2.0, -1.0)
    assert kkt.scaled_stationarity == 0.0
    assert summary["objective"] == 1.0
    assert kkt.scaled_feasibility >= 1.0 - 1e-12
    assert not kkt.satisfied(1e-3, 1e-3)
    kkt, _ = _certificate(m, [1000.0, 1000.0], 2.0, -1.0)
    assert kkt.satisfied(1e-12, 1e-12), kkt


def test_prox_al_reaches_the_lp_optimum_under_the_charged_gap():
    """The federated run's own certificate charges the gap too (each party's evaluation
    report): prox-al's "optimal" point is the optimum, within the gap the eps allows."""
    m = _lp()
    for eps in (1e-3, 1e-6):
        res = m.solve("prox-al", eps=eps)
        assert res.status == "optimal", res.message
        assert abs(res.objective) <= 10 * eps
        np.testing.assert_allclose(res.solution["x"], [-1000.0, -1000.0], rtol=0, atol=1e-3)
