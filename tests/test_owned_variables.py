"""Party-owned variables: declared with ``party.variable``, used only by their owner,
kept by their owner during a federated solve, written back to ``.value`` afterwards."""

from __future__ import annotations

import cvxpy as cp
import numpy as np
import pytest

import fedmodel as fm

CLARABEL_TIGHT = {"tol_gap_abs": 1e-10, "tol_gap_rel": 1e-10, "tol_feas": 1e-10}


def intercept_model(n: int = 3, rows: int = 10, seed: int = 0):
    """Shared weights, one intercept per client (owned, with a bound), a server-owned slack
    in a server constraint; and the same problem in plain cvxpy."""
    rng = np.random.default_rng(seed)
    model = fm.Model("intercepts")
    w = model.variable(2, name="w")
    W, B, S = cp.Variable(2), cp.Variable(n), cp.Variable()
    obj, cons, owned = 0, [], []
    design = np.zeros((n * rows + 1, 2 + n + 1))  # the objective is ||design z - .||^2
    design[-1, -1] = 1.0
    for k in range(n):
        X, y = rng.normal(size=(rows, 2)), rng.normal(size=rows) + k
        site = model.client(f"c{k}")
        b = site.variable(name=f"b{k}")
        owned.append(b)
        Xd, yd = site.data(X, name="X"), site.data(y, name="y")
        site.minimize(cp.sum_squares(Xd @ w + b - yd) / rows)
        site.subject_to(b >= 0.2 * k + 0.6, name="floor")
        obj += cp.sum_squares(X @ W + B[k] - y) / rows
        design[k * rows : (k + 1) * rows, :2] = X / np.sqrt(rows)
        design[k * rows : (k + 1) * rows, 2 + k] = 1 / np.sqrt(rows)
        cons.append(B[k] >= 0.2 * k + 0.6)
    s = model.server.variable(name="slack")
    model.server.minimize(cp.square(s))
    model.server.subject_to(w[0] - s <= -0.2, name="coupling")
    obj += cp.square(S)
    cons.append(W[0] - S <= -0.2)
    prob = cp.Problem(cp.Minimize(obj), cons)
    prob.solve(solver="CLARABEL", **CLARABEL_TIGHT)
    strong = 2 * np.linalg.eigvalsh(design.T @ design).min()  # strong convexity modulus
    return model, owned, s, (W.value, B.value, S.value, prob.value, strong)


@pytest.mark.parametrize("method", ["prox-al", "cprox-al", "centralized"])
def test_values_written_back_and_match_plain_cvxpy(method):
    model, owned, s, (W, B, S, ref, strong) = intercept_model()
    res = model.solve(method=method, eps=1e-7)
    assert res.status == "optimal" and res.kkt.satisfied(1e-7, 1e-7)
    gap = abs(res.objective - ref)
    assert gap <= 1e-6 * max(1.0, abs(ref))
    # strong convexity on the (convex) feasible set: (m/2)||z - z*||^2 <= f(z) - f*, for
    # z feasible up to the certified 1e-7 (the slack's share of the gap bound: + 1e-7)
    dist = np.sqrt(2 * (gap + 1e-7) / strong)
    z = np.r_[model.variables[0].value, [b.value for b in owned], s.value]
    assert np.linalg.norm(z - np.r_[W, B, S]) <= dist, (np.linalg.norm(z - np.r_[W, B, S]), dist)
    assert set(res.solution) == {"w", "slack", "b0", "b1", "b2"}
    assert res.solution["b1"] == pytest.approx(owned[1].value)


def test_owned_values_never_cross_the_network():
    """Every algorithm message carries shared-size vectors or scalars; the evaluation round
    sends the shared part and gets back the shared gradient plus one number per party."""
    model, owned, s, _ = intercept_model(n=2)
    res = model.solve(method="prox-al", eps=1e-5)
    assert res.status == "optimal"
    shared = model.variables[0].size
    seen = set()
    for row in res.ledger:
        for key, shape in row["shapes"].items():
            seen.add((row["channel"], row["kind"], key))
            if key == "metric":  # the Hessian metric of the ADMM penalty: shared x shared
                assert tuple(shape) == (shared, shared), (row["kind"], shape)
            elif row["channel"] == "algorithm" or key in ("w", "grad"):
                assert shape in ((), (shared,)), (row["kind"], key, shape)
    assert ("diagnostic", "evaluate_reply", "owned_stationarity") in seen
    # model.summary()'s rows (the run's declared table) say the same
    from fedmodel.algorithms.privacy import privacy_rows

    rows = {(r["kind"], r["direction"]): r["floats"] for r in privacy_rows(model.compile())}
    sizes = {(r["kind"], r["floats"]) for r in res.ledger if r["channel"] == "algorithm"}
    assert res.extra["inner_solver"] == "exact-admm"  # (the default with owned variables)
    assert ("xadmm_w", rows[("xadmm_w", "server -> client")]) in sizes
    assert ("xadmm_w_reply", rows[("xadmm_w", "client -> server")]) in sizes
    assert ("outer_reply", rows[("outer", "client -> server")]) in sizes
    # only the last report (to the caller, for .value) holds a client's own block
    owned_rows = [r for r in res.ledger if "owned" in r["shapes"]]
    assert {r["kind"] for r in owned_rows} == {"report_reply"}
    assert all(r["channel"] == "diagnostic" for r in owned_rows)


def test_admm_with_owned_variables_and_no_constraints():
    rng = np.random.default_rng(1)
    model = fm.Model()
    w = model.variable(2, name="w")
    W, obj = cp.Variable(2), 0
    for k in range(3):
        X, y = rng.normal(size=(8, 2)), rng.normal(size=8)
        site = model.client(f"c{k}")
        b = site.variable(name=f"b{k}")
        site.minimize(cp.sum_squares(site.data(X, name="X") @ w + b - site.data(y, name="y")))
        B = cp.Variable()
        obj += cp.sum_squares(X @ W + B - y)
    ref = cp.Problem(cp.Minimize(obj))
    ref.solve(solver="CLARABEL", **CLARABEL_TIGHT)
    res = model.solve(method="admm", eps=1e-7)
    assert res.status == "optimal"
    assert abs(res.objective - ref.value) <= 1e-6 * max(1.0, abs(ref.value))


def test_processes_backend_keeps_owned_blocks_on_the_workers():
    model, owned, s, (W, B, S, ref, strong) = intercept_model(n=2)
    res = model.solve(method="prox-al", eps=1e-6, backend="processes", workers=2)
    assert res.status == "optimal"
    assert abs(res.objective - ref) <= 1e-5 * max(1.0, abs(ref))
    gap = abs(res.objective - ref)
    dist = np.sqrt(2 * (gap + 1e-6) / strong)
    assert np.linalg.norm([b.value - Bk for b, Bk in zip(owned, B)]) <= dist


def test_another_party_using_an_owned_variable_is_an_error():
    model, owned, s, _ = intercept_model(n=2)
    model.clients[1].minimize(cp.square(owned[0]), name="borrows b0")
    with pytest.raises(fm.OwnershipError) as err:
        model.compile()
    msg = str(err.value)
    assert "[c1]" in msg and "'borrows b0' uses variable 'b0' owned by 'c0'" in msg
    assert err.value.party == "c1"

    model, owned, s, _ = intercept_model(n=2)
    model.clients[0].subject_to(s <= 3, name="peeks at the slack")
    with pytest.raises(fm.OwnershipError, match=r"\[c0\].*'slack' owned by 'server'"):
        model.compile()

    model, owned, s, _ = intercept_model(n=2)
    model.server.subject_to(owned[1] <= 3, name="caps b1")
    with pytest.raises(fm.OwnershipError, match=r"\[server\] 'caps b1' uses variable 'b1'"):
        model.compile()


def test_methods_without_owned_variable_support_say_so():
    model, *_ = intercept_model(n=2)
    with pytest.raises(fm.UnsupportedError, match="does not take party-owned variables"):
        model.solve(method="dald-cc")


def test_declaration_errors():
    model = fm.Model()
    model.variable(2, name="w")
    site = model.client("a")
    b = site.variable(3, name="b")
    with pytest.raises(fm.ModelError, match="'b' already exists"):
        model.client("c").variable(name="b")
    with pytest.raises(fm.ModelError, match="shape must be positive"):
        site.variable((0,))
    with pytest.raises(fm.UnsupportedError, match="whole model variable"):
        model.regularize(cp.norm1(b))  # h is the server's, on shared variables only
    assert site.owned_variables == (b,) and model.owner_of(b) == "a"


def test_shared_size_starting_point_is_accepted():
    model, owned, s, (W, B, S, ref, strong) = intercept_model(n=2)
    res = model.solve(method="prox-al", eps=1e-6, w0=np.array([0.5, -0.5]))
    assert res.status == "optimal"
    assert abs(res.objective - ref) <= 1e-5 * max(1.0, abs(ref))
