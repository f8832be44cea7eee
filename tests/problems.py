"""Small instances of seed 000's three problem classes, shared by the tests."""

from __future__ import annotations

import textwrap

import cvxpy as cp
import numpy as np

import fedmodel as fm
from fedmodel.models import fairness_model, lcqp_instance, lcqp_model, neyman_pearson_model


def least_squares_model(n_clients=3, d=4, seed=0):
    """A ridge-regularised least-squares model over ``n_clients`` sites (20 rows each)."""
    rng = np.random.default_rng(seed)
    w_true = rng.normal(size=d)
    model = fm.Model("ls")
    w = model.variable(d, name="w")
    for k in range(n_clients):
        A = rng.normal(size=(20, d))
        b = A @ w_true + 0.1 * rng.normal(size=20)
        site = model.client(f"site{k}")
        site.minimize(cp.sum_squares(site.data(A, name="A") @ w - site.data(b, name="b")) / 40)
    model.regularize(1e-2 * cp.sum_squares(w))
    return model


def logistic_clients(n=3, rows=8, d=20, seed=5, name="logistic"):
    """``n`` clients with a logistic loss over ``rows`` random rows each; returns the model
    and its shared ``w`` (the caller adds the server's part)."""
    rng = np.random.default_rng(seed)
    m = fm.Model(name)
    w = m.variable(d, name="w")
    for k in range(n):
        X = rng.normal(size=(rows, d))
        y = np.sign(rng.normal(size=rows))
        c = m.client(f"c{k}")
        c.minimize(cp.sum(cp.logistic(-cp.multiply(c.data(y, name="y"), c.data(X, name="X") @ w))))
    return m, w


def np_sites(n: int, d: int = 4, m0: int = 60, m1: int = 30, seed: int = 0):
    """Overlapping Gaussian classes (plus an intercept column) so that the class-1
    constraint is active and the objective is O(1)."""
    rng = np.random.default_rng(seed)
    shift = np.r_[np.full(d, 0.6), 0.0]
    sites = []
    for _ in range(n):
        X0 = np.c_[rng.normal(size=(m0, d)), np.ones(m0)]
        X1 = np.c_[rng.normal(size=(m1, d)), np.ones(m1)] + shift
        sites.append((X0, X1))
    return sites


def np_model(n: int, r: float = 0.45, seed: int = 0, **kw):
    return neyman_pearson_model(np_sites(n, seed=seed, **kw), r=r)


def fairness_parts(n: int, d: int = 3, m: int = 80, seed: int = 0):
    rng = np.random.default_rng(seed)
    beta_true = rng.normal(size=d + 1)

    def part(rows):
        s = (rng.random(rows) < 0.4).astype(float)
        X = np.c_[rng.normal(size=(rows, d)) + 0.8 * s[:, None], np.ones(rows)]
        p = 1 / (1 + np.exp(-(X @ beta_true) - 1.0 * s))
        y = (rng.random(rows) < p).astype(float)
        return X, y, s

    return [part(m) for _ in range(n)], part(m)


def fairness_test_model(n: int, r: float = 0.05, seed: int = 0):
    clients, server = fairness_parts(n, seed=seed)
    return fairness_model(clients, server, r=r)


def lcqp_test_model(n: int, d: int = 10, m: int = 2, seed: int = 0):
    return lcqp_model(lcqp_instance(n, d, m, random_state=seed))


#: Clarabel at tight tolerances: the independent reference the federated answers are held to
CLARABEL_TIGHT = {"tol_gap_abs": 1e-10, "tol_gap_rel": 1e-10, "tol_feas": 1e-10}


def kl_moments(seed: int = 11, d: int = 5, n: int = 3, bound: float = 0.4, step: float = 0.05):
    """KL divergence to each client's prior (a restricted domain), a moment bound per
    client (``grid @ w <= bound + step k``) and the simplex at the server: the model, the
    pooled cvxpy problem and its variable."""
    rng = np.random.default_rng(seed)
    m = fm.Model("kl-moments")
    w = m.variable(d, name="w")
    W = cp.Variable(d)
    m.server.subject_to([cp.sum(w) == 1, w >= 0])
    obj, cons = 0, [cp.sum(W) == 1, W >= 0]
    grid = np.linspace(0, 1, d)
    for k in range(n):
        q = rng.dirichlet(np.ones(d))
        c = m.client(f"c{k}")
        c.minimize(cp.sum(cp.kl_div(w, c.data(q, name="q"))) / n)
        c.subject_to(c.data(grid, name="g") @ w <= bound + step * k)
        obj = obj + cp.sum(cp.kl_div(W, q)) / n
        cons.append(grid @ W <= bound + step * k)
    return m, cp.Problem(cp.Minimize(obj), cons), W


def clarabel_reference(obj, cons) -> float:
    """Optimal value of ``min obj s.t. cons`` by a plain cvxpy/Clarabel solve (tight)."""
    prob = cp.Problem(cp.Minimize(obj), cons)
    prob.solve(solver="CLARABEL", **CLARABEL_TIGHT)
    assert prob.status == "optimal", prob.status
    return float(prob.value)


#: the model file the deployment tests hand every organisation (three Neyman-Pearson sites)
DEPLOYMENT_MODEL = textwrap.dedent(
    """
    import cvxpy as cp
    import fedmodel as fm

    PARTIES = ["site0", "site1", "site2"]


    def build(data):
        model = fm.Model("np-deploy")
        d = data[PARTIES[0]]["X0"].shape[1]
        w = model.variable(d, name="w")
        for name in PARTIES:
            X0, X1 = data[name]["X0"], data[name]["X1"]
            site = model.client(name)
            A0 = site.data(X0, name="class0")
            A1 = site.data(X1, name="class1")
            site.minimize(cp.sum(cp.logistic(A0 @ w)) / (X0.shape[0] * len(PARTIES)))
            site.subject_to(cp.sum(cp.logistic(-(A1 @ w))) / X1.shape[0] <= 0.45)
        return model
    """
)


def routing_model(loss="square", client_con=None, server_con=None, reg=None, d=4):
    """Two clients with 10 rows each, for the tests of which inner solver prox-al's "auto"
    picks: their ``loss`` (``"square"``, ``"logistic"``, ``"hinge"`` or ``"kl"``, a term with
    a restricted domain), optional constraints ``client_con(w, A)`` and ``server_con(w)``,
    and an optional ``h`` (``"l1"``, ``"group"``, ``"sumsq"``)."""
    rng = np.random.default_rng(0)
    m = fm.Model("routing")
    w = m.variable(d, name="w")
    for k in range(2):
        c = m.client(f"c{k}")
        A = c.data(rng.normal(size=(10, d)), name="A")
        if loss == "square":
            c.minimize(cp.sum_squares(A @ w - 1) / 20)
        elif loss == "logistic":
            c.minimize(cp.sum(cp.logistic(A @ w)) / 20)
        elif loss == "hinge":
            c.minimize(cp.sum(cp.pos(1 - A @ w)) / 20)
        else:  # "kl": a restricted domain
            c.minimize(cp.sum(cp.kl_div(w + 2, np.ones(d))) / 20 + cp.sum_squares(A @ w) / 20)
        if client_con is not None:
            c.subject_to(client_con(w, A))
    if server_con is not None:
        m.server.subject_to(server_con(w))
    if reg == "l1":
        m.regularize(0.1 * cp.norm1(w))
    elif reg == "group":
        m.regularize(0.1 * cp.norm(w, 2))
    elif reg == "sumsq":
        m.regularize(0.1 * cp.sum_squares(w))
    return m


def route(model, **options) -> tuple[str, str]:
    """``(inner solver, why)`` that prox-al's routing picks for ``model`` at ``options``."""
    from fedmodel.algorithms.proxal.options import ProxALOptions
    from fedmodel.algorithms.proxal.routes import choose

    route, note = choose(model.compile(), ProxALOptions(**options), True)
    return route.name, note


def random_two_balls(seed: int):
    """Two clients' 2-norm balls ``||w - c_i|| <= r_i`` that do not meet (an infeasible
    model): ``d`` in 5..20, radii in [0.5, 2], a gap in [0.1, 1] between the balls along a
    random direction, each client's least-squares loss (even seeds) or logistic loss (odd
    seeds) on 20 to 59 random rows of its own."""
    rng = np.random.default_rng(seed)
    d = int(rng.integers(5, 21))
    model = fm.Model(f"two-balls-{seed}")
    w = model.variable(d, name="w")
    u = rng.normal(size=d)
    u /= np.linalg.norm(u)
    r = rng.uniform(0.5, 2.0, size=2)
    c0 = rng.normal(size=d)
    c1 = c0 + (r[0] + r[1] + rng.uniform(0.1, 1.0)) * u
    for k, c in enumerate([c0, c1]):
        n = int(rng.integers(20, 60))
        X = rng.normal(size=(n, d))
        beta = rng.normal(size=d)
        client = model.client(f"c{k}")
        if seed % 2:
            y = np.where(X @ beta + 0.5 * rng.normal(size=n) > 0, 1.0, -1.0)
            client.minimize(cp.sum(cp.logistic(-cp.multiply(y, X @ w))) / n)
        else:
            y = X @ beta + 0.3 * rng.normal(size=n)
            client.minimize(cp.sum_squares(X @ w - y) / n)
        client.subject_to(cp.norm(w - c, 2) <= r[k])
    return model
