"""Record the iterates of every family on small seed problems, to compare a refactoring with
main bit for bit (a change of the protocol must not change one iterate).

Usage (record with one checkout, compare with another)::

    PYTHONPATH=<a checkout of the base commit> python benchmarks/protocol_iterates.py record /tmp/main.npz
    PYTHONPATH=.          python benchmarks/protocol_iterates.py compare /tmp/main.npz

Each case stores the returned point, the multipliers, the round counts and every numeric
field of every history row (one row per outer iteration: objective, violation, KKT
residuals ...); ``compare`` checks them with ``np.array_equal`` (NaN equal to NaN) and
prints the cases that differ. A third argument, a regular expression, keeps only the cases whose name matches it
(``"prox-al|models|admm method"`` for prox-al's routes).
"""

from __future__ import annotations

import os
import re
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _cases():
    from problems import fairness_test_model, lcqp_test_model, least_squares_model, np_model

    from fedmodel.datasets import load_breast_cancer, split_by_class, split_stratified
    from fedmodel.models import neyman_pearson_model

    def demo():  # fedmodel demo: NP on breast cancer, 3 clients, prox-al at its defaults
        ds = load_breast_cancer()
        sites = []
        for X, y in split_stratified(ds.X, ds.y, 3, random_state=0):
            by = split_by_class(X, y)
            sites.append((by[0], by[1]))
        return neyman_pearson_model(sites, r=0.3)

    def least_squares(n=3, d=4, seed=0):
        return least_squares_model(n, d, seed)

    yield "demo prox-al", lambda: demo().solve("prox-al", eps=1e-3)
    yield "np prox-al adaptive", lambda: np_model(3).solve("prox-al", eps=1e-4)
    yield "np prox-al paper", lambda: np_model(3).solve("prox-al", variant="paper", max_outer=30)
    yield (
        "np prox-al admm inner",
        lambda: np_model(3).solve("prox-al", inner_solver="admm", max_outer=20),
    )
    yield "lcqp prox-al (table1)", lambda: lcqp_test_model(3).solve("prox-al", eps=1e-4)
    yield (
        "lcqp prox-al paper (table1)",
        lambda: lcqp_test_model(3).solve("prox-al", variant="paper", max_outer=30),
    )
    yield (
        "fairness prox-al newton",
        lambda: fairness_test_model(3).solve("prox-al", inner_solver="newton", max_outer=30),
    )
    # every prox-al inner solver (route), the adaptive variant's options and Anderson
    yield (
        "np prox-al admm anderson",
        lambda: np_model(3).solve("prox-al", inner_solver="admm", anderson=3, max_outer=15),
    )
    yield (
        "np prox-al admm outer anderson",
        lambda: np_model(3).solve(
            "prox-al", inner_solver="admm", outer_anderson=3, adaptive_rho=True, max_outer=15
        ),
    )
    yield (
        "lcqp prox-al admm hessian metric",
        lambda: lcqp_test_model(3).solve(
            "prox-al", inner_solver="admm", penalty_metric="hessian", max_outer=15
        ),
    )
    yield (
        "ls admm method adaptive",
        lambda: least_squares(seed=1).solve("admm", variant="adaptive", anderson=2, max_inner=80),
    )
    yield (
        "np prox-al quasi-newton",
        lambda: np_model(3).solve("prox-al", inner_solver="quasi-newton", max_outer=20),
    )
    yield (
        "np prox-al quasi-newton outer anderson",
        lambda: np_model(3).solve(
            "prox-al", inner_solver="quasi-newton", outer_anderson=2, max_outer=20
        ),
    )
    yield (
        "lcqp prox-al exact-admm",
        lambda: lcqp_test_model(3).solve("prox-al", inner_solver="exact-admm", max_outer=20),
    )
    yield (
        "np prox-al newton",
        lambda: np_model(3).solve("prox-al", inner_solver="newton", max_outer=20),
    )

    def bench(name, **kw):  # benchmarks/models.py at its quick size, prox-al's route for it
        import models

        return lambda: models.MODELS[name][0](True).model.solve("prox-al", **kw)

    yield "models lasso-5 (prox-quasi-newton)", bench("lasso-5", max_outer=25)
    yield "models lad-1 (exact-admm)", bench("lad-1", max_outer=25)
    yield "models markowitz (exact-admm walls)", bench("markowitz", max_outer=25)
    yield "models ridge-20 (quasi-newton)", bench("ridge-20", max_outer=25)
    yield "models log-sum-exp-5", bench("log-sum-exp-5", max_outer=25)
    yield "models svm-1 paper", bench("svm-1", variant="paper", max_outer=15)
    yield "models elastic-net-20 admm", bench("elastic-net-20", inner_solver="admm", max_outer=10)
    yield "ls admm", lambda: least_squares().solve("admm", max_inner=60)
    yield "ls dald-cc", lambda: least_squares().solve("dald-cc", eps_pri=1e-7, eps_dual=1e-7)
    yield (
        "ls dald-dc",
        lambda: least_squares(seed=3).solve(
            "dald-dc", eps_pri=1e-6, eps_dual=1e-6, topology="chain"
        ),
    )
    yield (
        "np dald-cc",
        lambda: np_model(3).solve(
            "dald-cc", eps_pri=1e-5, eps_dual=1e-5, max_iter=300, penalty=100.0
        ),
    )
    yield "ls fedavg", lambda: least_squares().solve("fedavg", local_steps=2, max_rounds=25)
    yield "ls fedprox", lambda: least_squares().solve("fedprox", max_rounds=25)
    yield "ls dgd", lambda: least_squares(seed=3).solve("dgd", topology="ring", max_rounds=40)

    def vfl(method, **kw):
        from test_vfl import small_problem

        from fedmodel.algorithms.vfl.run import solve_vertical

        return solve_vertical(small_problem(test=True), method, **kw)

    kw = dict(eps=0.05, eta=2.0, Q=3, local_updates="random", seed=4, max_rounds=40)
    yield "vfl fair-vfl", lambda: vfl("fair-vfl", **kw)
    yield "vfl fair-vfl delays", lambda: vfl("fair-vfl", delays=[0, 1, 2], **kw)
    yield "vfl fedbcd", lambda: vfl("fedbcd", **kw)

    from test_ssca_methods import feature_model, sample_model

    yield "ssca sample", lambda: sample_model().solve("ssca", rounds=12, batch_size=5, eval_every=3)

    def constrained_sample():
        m = sample_model(objective="norm")
        m.constrain_loss(0.6)
        return m.solve("ssca", rounds=12, batch_size=5, eval_every=3)

    def constrained_feature():
        m = feature_model(objective="norm")
        m.constrain_loss(0.6)
        return m.solve("ssca", rounds=8, batch_size=7)

    yield "ssca sample constrained", constrained_sample
    yield "ssca feature constrained", constrained_feature
    yield "ssca feature", lambda: feature_model().solve("ssca", rounds=10, batch_size=7)
    yield "fedavg-sgd", lambda: sample_model().solve("fedavg-sgd", rounds=8, batch_size=5)
    yield "vertical-sgd-m", lambda: feature_model().solve("vertical-sgd-m", rounds=8, batch_size=7)


def _record(res) -> dict[str, np.ndarray]:
    out = {"x": np.asarray(res.x, dtype=float)}
    mult = getattr(res, "multipliers", None) or {}
    for party in sorted(mult):
        for k, v in sorted(mult[party].items()):
            if isinstance(v, np.ndarray) or np.isscalar(v):
                out[f"mult/{party}/{k}"] = np.asarray(v, dtype=float)
    for k, v in sorted((res.rounds or {}).items()):
        out[f"rounds/{k}"] = np.asarray(v, dtype=float)
    keys = sorted({k for row in res.history for k in row})
    for k in keys:
        vals = [row.get(k) for row in res.history]
        if all(isinstance(v, (int, float, np.integer, np.floating)) for v in vals):
            if "second" in k or "time" in k:
                continue
            out[f"history/{k}"] = np.asarray(vals, dtype=float)
    out["status"] = np.asarray(res.status)
    return out


def _selected(only: str):
    return [(name, run) for name, run in _cases() if re.search(only, name)]


def record(path: str, only: str = "") -> None:
    import fedmodel

    print("fedmodel from", fedmodel.__file__)
    data = {}
    for name, run in _selected(only):
        res = run()
        print(f"{name}: {res.status}, {res.rounds}")
        for k, v in _record(res).items():
            data[f"{name}|{k}"] = v
    np.savez(path, **data)


def compare(path: str, only: str = "") -> int:
    import fedmodel

    print("fedmodel from", fedmodel.__file__)
    ref = dict(np.load(path))
    bad = []
    for name, run in _selected(only):
        res = run()
        mine = {f"{name}|{k}": v for k, v in _record(res).items()}
        theirs = {k: v for k, v in ref.items() if k.split("|")[0] == name}
        diff = sorted(
            k
            for k in set(mine) | set(theirs)
            if k not in mine
            or k not in theirs
            or not np.array_equal(mine[k], theirs[k], equal_nan=mine[k].dtype.kind == "f")
        )
        more = f" (+{len(diff) - 5} more)" if len(diff) > 5 else ""
        print(f"{name}: {'same' if not diff else 'DIFFERENT ' + str(diff[:5]) + more}")
        if diff:
            bad.append(name)
    print(f"{len(bad)} case(s) differ" if bad else "every case bit for bit the same")
    return 1 if bad else 0


if __name__ == "__main__":
    what, where = sys.argv[1], sys.argv[2]
    only = sys.argv[3] if len(sys.argv) > 3 else ""  # (only the cases whose name has it)
    if what == "record":
        record(where, only)
    else:
        sys.exit(compare(where, only))
