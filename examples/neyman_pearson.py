"""Neyman-Pearson classification (seed 000, problem 26), federated over 5 hospitals.

The README's model, on the bundled UCI breast-cancer data: each site minimises its class-0
(benign) logistic loss subject to its own class-1 (malignant) loss staying below r = 0.2;
the server bounds ||w||_inf and adds a small ridge term h. Solved with prox-al (seed 000
Table 2's settings) and compared with the centralized optimum.

Run:  python examples/neyman_pearson.py
"""

import time

import cvxpy as cp
import numpy as np

import fedmodel as fm
from fedmodel.datasets import load_breast_cancer, split_stratified

N_SITES, R = 5, 0.2

data = load_breast_cancer()
parts = split_stratified(data.X, data.y, N_SITES, random_state=0)
sites = [(X[y == 0], X[y == 1]) for X, y in parts]

model = fm.Model("neyman-pearson")
w = model.variable(data.X.shape[1], name="w")
for k, (X0, X1) in enumerate(sites):
    site = model.client(f"site{k}")
    A0 = site.data(X0, name="class0")
    A1 = site.data(X1, name="class1")
    site.minimize(cp.sum(cp.logistic(A0 @ w)) / (len(X0) * len(sites)), name="class-0 loss")
    site.subject_to(cp.sum(cp.logistic(-(A1 @ w))) / len(X1) <= R, name="class-1 loss")
model.server.subject_to(cp.norm(w, "inf") <= 50, name="||w||_inf <= 50")
model.regularize(1e-4 * cp.sum_squares(w))

t0 = time.perf_counter()
res = model.solve(method="prox-al", eps=1e-3, beta=300, sbar=1e-3, rho=0.01)
t_fed = time.perf_counter() - t0
t0 = time.perf_counter()
ref = model.solve(method="centralized")
t_ref = time.perf_counter() - t0

print(model.summary(print_=False), "\n")
print(res.compare(ref))
print(f"\nprox-al: {res.status}, {res.rounds['outer']} outer / {res.rounds['communication']} "
      f"communication rounds, {t_fed:.1f} s; centralized: {ref.status}, {t_ref:.1f} s")
loss1 = [float(np.mean(np.logaddexp(0, -(X1 @ res.x)))) for _, X1 in sites]
print("class-1 loss per site:", " ".join(f"{v:.4f}" for v in loss1), f"(bound {R})")
