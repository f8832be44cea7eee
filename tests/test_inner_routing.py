"""Which inner solver prox-al's "auto" picks (routes.choose), what model.summary() says a run
sends, and an inner solver written here run through the table."""

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
    # below eps = 1e-5 a smooth model's walls at the server alone stay with quasi-Newton
    # (in the objective's units; its model step imposes them), a client's go to exact-admm
    # (the quasi-Newton model learns them only through multiplier updates)
    assert route(_model(None, box), eps=1e-6)[0] == "quasi-newton"
    qcqp = lambda w, A: [cp.sum_squares(w) <= 2]  # noqa: E731
    assert route(_model(qcqp, None), eps=1e-6)[0] == "exact-admm"
    assert route(_model(qcqp, box), eps=1e-7)[0] == "exact-admm"
    # the user's choice is kept
    assert route(_model(None, box), inner_solver="quasi-newton")[0] == "quasi-newton"
    # above EXACT_WALLS_MAX_SHARED shared variables the clients' dense steps are too large
    import fedmodel.algorithms.proxal.obstacles as server_module

    monkeypatch.setattr(server_module, "EXACT_WALLS_MAX_SHARED", 3)
    assert route(_model(None, box))[0] == "quasi-newton"  # (10 rows per client, d = 4)


def _rows_split(name: str, objective_at_a_client: bool = False):
    """Maros-Meszaros ``name`` federated as benchmarks/maros_meszaros.py splits it (the
    rows ``l <= A x <= u`` over four clients, the bounds and the objective at the server;
    or the objective at the first client), and its pooled Clarabel optimum."""
    from pathlib import Path

    import numpy as np
    import scipy.io as sio
    from problems import CLARABEL_TIGHT
    from scipy import sparse

    import fedmodel as fm

    raw = sio.loadmat(Path(__file__).parents[1] / "benchmarks/data/maros_meszaros" / f"{name}.mat")
    n = int(np.asarray(raw["n"]).ravel()[0])
    P, q = sparse.csc_matrix(raw["P"], dtype=float), raw["q"].ravel().astype(float)
    A = sparse.csr_matrix(raw["A"], dtype=float)
    lo, up = raw["l"].ravel().astype(float), raw["u"].ravel().astype(float)
    lo[lo <= -1e19], up[up >= 1e19] = -np.inf, np.inf  # (the set's infinity)
    rows = A.shape[0] - n
    bounds = (lo[rows:], up[rows:])
    model = fm.Model(name)
    x = model.variable(n, name="x", bounds=bounds)
    sites = [model.client(f"client{i}") for i in range(4)]
    for site, block in zip(sites, np.array_split(np.arange(rows), 4)):
        Ai = site.data(A[block], name="A")
        cons = [Ai @ x >= lo[block]] if np.all(np.isfinite(lo[block])) else []
        cons += [Ai @ x <= up[block]] if np.all(np.isfinite(up[block])) else []
        site.subject_to(cons, name="rows")
    owner = sites[0] if objective_at_a_client else model.server
    owner.minimize(
        0.5 * cp.quad_form(x, owner.data(P, name="P"), assume_PSD=True)
        + owner.data(q, name="q") @ x
    )
    X = cp.Variable(n)
    cons = []
    for side, sign in ((lo, 1.0), (up, -1.0)):
        rows_at, vars_at = (
            np.flatnonzero(np.isfinite(side[:rows])),
            np.flatnonzero(np.isfinite(side[rows:])),
        )
        if rows_at.size:
            cons += [sign * (A[rows_at] @ X) >= sign * side[rows_at]]
        if vars_at.size:
            cons += [sign * X[vars_at] >= sign * side[rows:][vars_at]]
    pooled = cp.Problem(cp.Minimize(0.5 * cp.quad_form(X, P, assume_PSD=True) + q @ X), cons)
    pooled.solve(solver="CLARABEL", **CLARABEL_TIGHT)
    assert pooled.status == "optimal", pooled.status
    return model, pooled.value


def test_polyhedral_walls_of_objective_free_clients_keep_prox_quasi_newton():
    """A QP split as its rows (Maros-Meszaros PRIMALC2, 231 variables, 7 rows): each
    client's exact step would be a projection onto its polyhedron, whose consensus crawled
    (exact-admm read it as infeasible); "auto" keeps prox-quasi-newton, which certifies
    the optimum. A walled client with an objective keeps exact-admm."""
    from fedmodel.algorithms.proxal.obstacles import polyhedral_walls_only

    model, ref = _rows_split("PRIMALC2")
    assert polyhedral_walls_only(model.compile())
    res = model.solve(method="prox-al")
    assert res.extra["inner_solver"] == "prox-quasi-newton"
    assert res.status == "optimal", res.message
    assert abs(res.objective - ref) <= 1e-3 * max(1.0, abs(ref))
    walled_objective, _ = _rows_split("PRIMALC2", objective_at_a_client=True)
    assert not polyhedral_walls_only(walled_objective.compile())


def test_walls_above_the_dense_size_go_to_exact_admm_when_parties_have_few_rows(monkeypatch):
    """Above EXACT_WALLS_MAX_SHARED the exact steps are Woodbury steps when each party has
    at most LOW_RANK_RATIO * d data rows (here 10 rows, d = 40 > the patched limit 3)."""
    import fedmodel.algorithms.proxal.obstacles as server_module

    monkeypatch.setattr(server_module, "EXACT_WALLS_MAX_SHARED", 3)
    ball = lambda w: [cp.norm(w, 2) <= 1]  # noqa: E731
    assert route(_model(None, ball, d=40))[0] == "exact-admm"
    assert route(_model(None, ball, d=20))[0] == "quasi-newton"  # (10 rows > 0.25 * 20)


@pytest.mark.parametrize(
    "build, expected",
    [
        (lambda: routing_model("square", reg="l1", d=6), "prox-quasi-newton"),
        (lambda: routing_model("square", d=8), "quasi-newton"),
        (lambda: routing_model("hinge", d=4), "exact-admm"),
    ],
)
def test_the_summary_names_the_route_and_the_floats_of_each_message_the_run_sends(build, expected):
    """model.summary() names the inner solver a default run takes and the floats of each
    message kind of that run (generated from the route's declared table): the most floats
    one message of each kind carries in the run's ledger, both directions."""
    from fedmodel.algorithms.privacy import privacy_rows

    model = build()
    text = model.summary(print_=False)
    assert f"inner solver of prox-al on this model: {expected}" in text
    res = model.solve("prox-al", history=False)
    assert res.extra["inner_solver"] == expected and res.status == "optimal"
    rows = privacy_rows(model.compile(), "prox-al")
    declared = {
        (r["kind"], r["direction"] == "client -> server"): r["floats"]
        for r in rows
        if r["channel"] == "algorithm"
    }
    sent: dict = {}
    for r in res.ledger:
        if r["channel"] != "algorithm":
            continue
        key = (r["kind"].removesuffix("_reply"), r["receiver"] == "server")
        sent[key] = max(sent.get(key, 0), r["floats"])
    assert sent == {k: v for k, v in declared.items() if k in sent}
    # every kind the table declares for this run is one the run may send: here all but the
    # gradient rounds that replace curvature_w once its directions are turned off, and the
    # units round of a model whose objective's scale is outside the defaults' band
    unsent = {("gradient_w", False), ("gradient_w", True)}
    if res.extra.get("objective_units", [1.0])[0] == 1.0:
        unsent |= {("units", False), ("units", True)}
    assert set(declared) - set(sent) <= unsent


def test_a_toy_inner_solver_runs_through_the_table_end_to_end(monkeypatch):
    """An inner solver is one module and one table line: a toy (federated gradient descent
    on l_k, its own message kind, state and defaults) written here runs a prox-al solve to
    the pooled optimum, its messages declared, validated and in the ledger."""
    import numpy as np

    import fedmodel.algorithms.proxal.routes as routes
    from fedmodel.algorithms.messages import W
    from fedmodel.algorithms.proxal.inner import InnerClient, InnerOutcome, InnerSolver
    from fedmodel.runtime.schema import Field, MessageSpec

    grad = Field(("d",), reveals="the gradient of P_{i,k} at w")

    class ToyClient(InnerClient):
        def start(self, w, **request):
            self.host.w_center = np.asarray(w, dtype=float).copy()
            return self._on_toy_w(w)

        def _on_toy_w(self, w):
            return {"grad": self.host._grad_P(np.asarray(w, dtype=float))}

    class Toy(InnerSolver):
        name, defaults, client_part = "toy", {"outer_anderson": 0}, ToyClient
        start_reply = {"grad": grad}
        messages = (MessageSpec("toy_w", request={"w": W}, reply={"grad": grad}),)
        state_fields = ("steps",)

        def __init__(self, host):
            super().__init__(host)
            self.steps, self.start_grad = 0, None

        def take_start(self, replies):
            self.start_grad = sum(r.payload["grad"] for r in replies.values())

        def solve(self, runtime, tau, deadline):
            host, w = self.host, self.host.x.copy()
            g = self.start_grad + host.prox_weight * (w - host.x)
            for t in range(host.options.max_inner):
                if np.abs(g).max() <= tau:
                    return InnerOutcome(w, t, float(np.abs(g).max()), True, 0.0, gradient=g)
                w = w - 0.2 * g
                self.steps += 1
                runtime.next_round()
                replies = runtime.broadcast("toy_w", {"w": w})
                g = sum(r.payload["grad"] for r in replies.values())
                g = g + host.prox_weight * (w - host.x)
            return InnerOutcome(w, t + 1, float(np.abs(g).max()), False, 0.0, gradient=g)

    monkeypatch.setattr(routes, "ROUTES", (Toy, *routes.ROUTES))
    model = routing_model("square")
    res = model.solve("prox-al", inner_solver="toy", history=False)
    ref = model.solve("centralized")
    assert res.extra["inner_solver"] == "toy" and res.status == "optimal"
    assert res.extra["inner_solver_options"]["outer_anderson"] == 0
    assert np.allclose(res.x, ref.x, atol=1e-3)
    assert any(r["kind"] == "toy_w_reply" for r in res.ledger)
    assert "toy" in model.summary(print_=False)
