"""Which inner solver prox-al's "auto" picks on smooth convex models (server.inner_solver)."""

import cvxpy as cp
import pytest
from problems import route, routing_model


def _model(client_con=None, server_con=None, loss="square", d=4):
    return routing_model(loss, client_con, server_con, d=d)


@pytest.mark.parametrize(
    "client_con, server_con, expected",
    [
        (None, None, "quasi-newton"),  # unconstrained
        (None, lambda w: [cp.sum(w) == 1], "quasi-newton"),  # equalities only
        (None, lambda w: [w <= 1, w >= -1], "exact-admm"),  # a server box
        (None, lambda w: [cp.norm(w, 2) <= 1], "exact-admm"),  # a server ball
        (lambda w, A: [cp.sum_squares(w) <= 2], None, "exact-admm"),  # a client's QCQP wall
    ],
)
def test_inequality_walls_of_smooth_models_go_to_exact_admm(client_con, server_con, expected):
    mode, note = route(_model(client_con, server_con))
    assert mode == expected
    assert ("inequality constraints" in note) == (expected == "exact-admm")


def test_exponential_cone_constrained_parties_keep_quasi_newton():
    """Neyman-Pearson-type clients (a logistic constraint): quasi-Newton (Adult NP 226
    rounds against exact-admm's 677)."""
    con = lambda w, A: [cp.sum(cp.logistic(-(A @ w))) / 10 <= 0.5]  # noqa: E731
    assert route(_model(con, None, loss="logistic"))[0] == "quasi-newton"
    # an exponential-cone objective without constraints does not count (the ball is the server's)
    ball = lambda w: [cp.norm(w, 2) <= 1]  # noqa: E731
    assert route(_model(None, ball, loss="logistic"))[0] == "exact-admm"


def test_the_walls_rule_keeps_its_limits(monkeypatch):
    box = lambda w: [w <= 1, w >= -1]  # noqa: E731
    # below eps = 1e-5 exact-admm's interior-point duals cannot be certified: quasi-Newton
    assert route(_model(None, box), eps=1e-6)[0] == "quasi-newton"
    # the user's choice is kept
    assert route(_model(None, box), inner_solver="quasi-newton")[0] == "quasi-newton"
    # above EXACT_WALLS_MAX_SHARED shared variables the clients' dense steps are too large
    import fedmodel.algorithms.proxal.server as server_module

    monkeypatch.setattr(server_module, "EXACT_WALLS_MAX_SHARED", 3)
    assert route(_model(None, box))[0] == "quasi-newton"  # (10 rows per client, d = 4)


def test_walls_above_the_dense_size_go_to_exact_admm_when_parties_have_few_rows(monkeypatch):
    """Above EXACT_WALLS_MAX_SHARED the exact steps are Woodbury steps when each party has
    at most LOW_RANK_RATIO * d data rows (here 10 rows, d = 40 > the patched limit 3)."""
    import fedmodel.algorithms.proxal.server as server_module

    monkeypatch.setattr(server_module, "EXACT_WALLS_MAX_SHARED", 3)
    ball = lambda w: [cp.norm(w, 2) <= 1]  # noqa: E731
    assert route(_model(None, ball, d=40))[0] == "exact-admm"
    assert route(_model(None, ball, d=20))[0] == "quasi-newton"  # (10 rows > 0.25 * 20)
