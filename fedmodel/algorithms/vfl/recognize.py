"""Recognise a vertical DSL model (``client.publish``) as seed 002's vertical problem.

A DSL model is *vertical* when its clients publish expressions (:meth:`fedmodel.Client.publish`).
The vfl family solves one shape of it, the paper's model (seed 002, eqs. 1-3)::

    for k, cols in enumerate(blocks):
        party = model.client(name_k)
        theta = party.variable(m_k)                               # owned, never leaves
        scores = scores + party.publish(party.data(X_k) @ theta)  # X_k theta_k, published
        party.minimize(l2 * cp.sum_squares(theta))                 # h_k
    y, s = model.server.data(y_pm1), model.server.data(group)
    model.server.minimize(cp.sum(cp.logistic(-cp.multiply(y, scores))) / n)
    model.server.subject_to(cp.abs(fm.deo(scores, y, s)) <= eps, allow_nonconvex=True)

:func:`recognize` checks that shape and returns the
:class:`~fedmodel.algorithms.vfl.problem.VerticalProblem` and ``eps``; anything else is an
:class:`~fedmodel.errors.UnsupportedError` naming the party and term and saying what is
supported. The ownership rules (the server uses only published expressions, public data
and its own data; a party touches only its own block) are the compiler's
(:func:`fedmodel.compiler.partition.check_ownership`) and run first.

How the check is exact: the published expressions are matched structurally (``data @
theta``); each ``h_k`` must be a quadratic (cvxpy's ``is_quadratic``) whose Hessian, read
column by column from exact gradients, is ``2 l2 I`` with zero gradient and value at 0;
the server's objective is compared with ``(1/n) sum_i log(1 + exp(-y_i z_i))`` at ``theta
= 0`` and two random points, and the DEO's scores with ``sum_k X_k theta_k`` (an affine
map is equal to another when it is at 0 and at a random point, almost surely).

Examples
--------
>>> import numpy as np, cvxpy as cp, fedmodel as fm
>>> rng = np.random.default_rng(0)
>>> n = 100; X = rng.normal(size=(n, 4)); s = rng.random(n) < 0.5
>>> y = np.where(X[:, 0] + s > 0.5, 1.0, -1.0)
>>> model = fm.Model("vfl")
>>> scores = 0
>>> for k, cols in enumerate([[0, 1], [2, 3]]):
...     p = model.client(f"p{k}")
...     th = p.variable(2, name=f"th{k}")
...     scores = scores + p.publish(p.data(X[:, cols]) @ th, name="partial scores")
...     p.minimize(cp.sum_squares(th) / n)
>>> yh, sh = model.server.data(y), model.server.data(s)
>>> model.server.minimize(cp.sum(cp.logistic(-cp.multiply(yh, scores))) / n)
>>> gap = model.server.subject_to(cp.abs(fm.deo(scores, yh, sh)) <= 0.05, allow_nonconvex=True)
>>> problem, eps = recognize(model)
>>> problem.sizes, problem.l2 == 1 / n, eps
([2, 2], True, 0.05)
"""

from __future__ import annotations

import warnings
from typing import Any

import cvxpy as cp
import numpy as np

from fedmodel.algorithms.vfl.problem import VerticalProblem, logistic_loss
from fedmodel.dsl.data import PrivateData
from fedmodel.errors import UnsupportedError

SUPPORTED = (
    "the vfl family solves seed 002's vertical model: each client owns one vector "
    "theta_k = client.variable(m_k), publishes client.publish(client.data(X_k) @ theta_k) "
    "and minimizes l2 * cp.sum_squares(theta_k) (the same l2 for every client); the server "
    "minimizes cp.sum(cp.logistic(-cp.multiply(y, scores))) / n with scores the sum of the "
    "published expressions and has the one constraint cp.abs(fm.deo(scores, y, s)) <= eps "
    "(or the pair fm.deo(...) <= eps, fm.deo(...) >= -eps; allow_nonconvex=True); no shared "
    "variables, no regulariser h"
)


def _unsupported(what: str, party: str | None = None, term: Any = None) -> UnsupportedError:
    return UnsupportedError(f"{what}; {SUPPORTED}", party, None if term is None else str(term))


def _published_block(pub, theta: cp.Variable) -> np.ndarray:
    """``X_k`` of a publication ``X_k @ theta_k`` (matched structurally)."""
    e = pub.expr
    ok = (
        type(e).__name__ == "MulExpression"
        and len(e.args) == 2
        and isinstance(e.args[0], PrivateData)
        and e.args[0].owner == pub.owner
        and e.args[1] is theta
        and len(e.args[0].shape) == 2
    )
    if not ok:
        raise _unsupported(
            f"published expression '{pub.name}' is not (own data) @ {theta.name()}",
            pub.owner,
            e,
        )
    value = e.args[0].value
    return np.asarray(value.toarray() if hasattr(value, "toarray") else value, dtype=float)


def _l2_of(program, theta: cp.Variable, layout) -> float:
    """``l2`` when the client's objective is exactly ``l2 ||theta||^2`` (else an error)."""
    name = program.name
    if program.constraints:
        raise _unsupported(
            f"client constraints ({[c.label for c in program.constraints]}) are not taken",
            name,
        )
    expr = program.objective_expr()
    if not isinstance(expr, cp.Expression) or not program.objective:
        raise _unsupported("the client has no regulariser h_k", name)
    if not expr.is_quadratic():
        raise _unsupported(f"h_k = {expr} is not l2 * cp.sum_squares(theta)", name, expr)
    f = program.functions
    idx = layout.indices([theta])
    x = np.zeros(layout.size)
    v0, g0 = f.objective_and_grad(x)
    hess = np.empty((idx.size, idx.size))
    for j, i in enumerate(idx):
        x[:] = 0.0
        x[i] = 1.0
        hess[:, j] = f.objective_and_grad(x)[1][idx] - g0[idx]
    l2 = float(hess[0, 0]) / 2.0
    scale = max(abs(l2), 1e-300)
    if (
        abs(v0) > 1e-12 * scale
        or np.abs(g0).max(initial=0.0) > 1e-12 * scale
        or np.abs(hess - 2.0 * l2 * np.eye(idx.size)).max() > 1e-9 * scale
        or l2 < 0
    ):
        raise _unsupported(f"h_k = {expr} is not l2 * cp.sum_squares(theta)", name, expr)
    return l2


def _deo_bound(src) -> tuple[Any, str, float] | None:
    """``(info, side, bound)`` of ``fm.deo(...) <= b`` (side ``"upper"``) or ``fm.deo(...) >=
    b`` (``"lower"``) or ``cp.abs(fm.deo(...)) <= b`` (``"abs"``); None otherwise."""
    if src is None or type(src).__name__ != "Inequality":
        return None
    lhs, rhs = src.args
    for expr, const, side in ((lhs, rhs, "upper"), (rhs, lhs, "lower")):
        if const.variables() or const.size != 1:
            continue
        bound = float(np.asarray(const.value).ravel()[0])
        info = getattr(expr, "_fedmodel_deo", None)
        if info is not None:
            return info, side, bound
        if side == "upper" and type(expr).__name__ == "abs":
            info = getattr(expr.args[0], "_fedmodel_deo", None)
            if info is not None:
                return info, "abs", bound
    return None


def _deo_constraint(server) -> tuple[Any, float]:
    """The server's DEO constraint, ``cp.abs(fm.deo(...)) <= eps`` or the pair
    ``fm.deo(...) <= eps``, ``fm.deo(...) >= -eps`` (eqs. 4a-4b): its DEO info and eps."""
    terms = list(server.constraints)
    sources = list({id(c.source): c for c in terms}.values())
    bounds = [_deo_bound(c.source) for c in sources]
    bad = [c for c, b in zip(sources, bounds) if b is None]
    if bad or not sources:
        what = (
            f"server constraint '{bad[0].label}' is not a DEO bound"
            if bad
            else "the server has no constraint"
        )
        raise _unsupported(
            f"{what} (cp.abs(fm.deo(scores, y, s)) <= eps, or fm.deo(...) <= eps with "
            "fm.deo(...) >= -eps)",
            server.name,
            bad[0].source if bad else None,
        )
    sides = sorted(b[1] for b in bounds)
    if sides == ["abs"]:
        return bounds[0][0], bounds[0][2]
    if sides == ["lower", "upper"]:
        upper = next(b for b in bounds if b[1] == "upper")
        lower = next(b for b in bounds if b[1] == "lower")
        same = upper[0] is lower[0] or (
            upper[0].scores is lower[0].scores
            and np.array_equal(upper[0].y, lower[0].y)
            and np.array_equal(upper[0].group_a, lower[0].group_a)
        )
        if same and upper[2] == -lower[2] and upper[2] >= 0:
            return upper[0], upper[2]
    raise _unsupported(
        f"the server's DEO constraints {[c.label for c in sources]} are not one symmetric "
        "bound |D| <= eps (cp.abs(fm.deo(...)) <= eps, or fm.deo(...) <= eps with "
        "fm.deo(...) >= -eps)",
        server.name,
    )


def recognize(model, compiled=None) -> tuple[VerticalProblem, float]:
    """The vertical problem and ``eps`` of a DSL model written as seed 002's model.

    Parameters
    ----------
    model : fedmodel.Model
        A model whose clients publish their partial scores (see the module docstring).
    compiled : CompiledModel, optional
        ``model.compile()`` (compiled here when not given: the ownership checks run first).

    Returns
    -------
    (VerticalProblem, float)

    Raises
    ------
    UnsupportedError
        The model is vertical but not of the supported shape (names the party and term).
    """
    if compiled is None:
        compiled = model.compile()
    layout = compiled.layout
    if model.variables:
        raise _unsupported(f"shared variables {[v.name() for v in model.variables]} are not taken")
    if compiled.regularizer.terms:
        raise _unsupported("a regulariser h (model.regularize) is not taken")
    pubs = {}
    for pub in model.publications:
        if pub.owner in pubs:
            raise _unsupported(
                f"the client publishes two expressions ('{pubs[pub.owner].name}', '{pub.name}')",
                pub.owner,
            )
        pubs[pub.owner] = pub
    blocks, names, thetas, l2s = [], [], [], []
    for client in model.clients:
        own = [v for v in client.owned_variables if v.id not in layout.hidden]
        hidden = [v for v in client.owned_variables if v.id in layout.hidden]
        if hidden:
            raise _unsupported("non-smooth terms (epigraph variables) are not taken", client.name)
        if len(own) != 1 or own[0].ndim != 1:
            raise _unsupported(
                f"the client owns {[v.name() for v in own]}; expected one vector theta_k",
                client.name,
            )
        if client.name not in pubs:
            raise _unsupported("the client publishes nothing", client.name)
        theta = own[0]
        X_k = _published_block(pubs[client.name], theta)
        blocks.append(X_k)
        names.append(client.name)
        thetas.append(theta)
        l2s.append(_l2_of(compiled.program(client.name), theta, layout))
    if len(set(np.round(np.array(l2s) / max(l2s[0], 1e-300), 12))) > 1:
        raise _unsupported(f"the clients' l2 differ ({dict(zip(names, l2s))})")
    server = compiled.server
    if model.server.owned_variables:
        raise _unsupported("server-owned variables are not taken", server.name)
    info, eps = _deo_constraint(server)
    n = info.y.size
    for name, X_k in zip(names, blocks):
        if X_k.shape[0] != n:
            raise _unsupported(f"X_k has {X_k.shape[0]} rows, the labels {n}", name)
    _check_server_terms(model, server, info, blocks, thetas, n)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the caller's builder warns about small blocks
        problem = VerticalProblem(blocks, info.y, info.group_a, names, float(l2s[0]))
    return problem, eps


def _check_server_terms(model, server, info, blocks, thetas, n) -> None:
    """The server's objective is ``(1/n) sum logistic(-y z)`` and the DEO's scores are ``z``
    (exact comparisons at ``theta = 0`` and two random points)."""
    if not server.objective:
        raise _unsupported("the server has no objective", server.name)
    objective = server.objective_expr()
    saved = [t.value for t in thetas]
    rng = np.random.default_rng(12345)
    try:
        for trial in range(3):
            for t, X_k in zip(thetas, blocks):
                if trial == 0:
                    t.value = np.zeros(t.shape)
                else:  # scores of order one
                    scale = 1.0 / max(np.linalg.norm(X_k, 2), 1e-12)
                    t.value = rng.normal(size=t.shape) * scale * np.sqrt(t.size)
            z = sum(X_k @ t.value for X_k, t in zip(blocks, thetas))
            zd = np.asarray(info.scores.value, dtype=float).ravel(order="F")
            if zd.shape != z.shape or not np.allclose(zd, z, rtol=1e-10, atol=1e-10):
                raise _unsupported(
                    "the scores in fm.deo(scores, y, s) are not the sum of the published "
                    "expressions",
                    server.name,
                )
            want = float(logistic_loss(z, info.y).mean())
            got = float(np.asarray(objective.value))
            if not np.isclose(got, want, rtol=1e-10, atol=1e-12):
                raise _unsupported(
                    "the server's objective is not (1/n) sum logistic(-y * scores) with the "
                    "labels of fm.deo and scores the sum of the published expressions",
                    server.name,
                    objective,
                )
    finally:
        for t, v in zip(thetas, saved):
            t.value = v


def is_vertical(model) -> bool:
    """True when the model's clients publish expressions (a vertical model)."""
    return bool(getattr(model, "publications", ()))
