"""Linear-equality-constrained QP (seed 000, problem 25), generated as in its Section 5.1.

Client i holds (A_i, b_i, C_i, d_i), the server holds (C_0, d_0):
    min sum_i (w^T A_i w / 2 + b_i^T w)  s.t.  C_i w + d_i = 0  (i = 0..n)
Solved with prox-al (Table 1 settings: sbar = 0.1, beta = 10, rho = 1) at eps = 1e-3 and
1e-6, each compared with the centralized optimum.

Run:  python examples/lcqp.py
"""

import time

from fedmodel.models import lcqp_instance, lcqp_model

model = lcqp_model(lcqp_instance(n=5, d=100, m=1, random_state=0))
t0 = time.perf_counter()
ref = model.solve(method="centralized")
t_ref = time.perf_counter() - t0
print(f"centralized: {ref.status}, objective {ref.objective:.8f}, {t_ref:.2f} s\n")
for eps in (1e-3, 1e-6):
    t0 = time.perf_counter()
    res = model.solve(method="prox-al", eps=eps, sbar=100 * eps, beta=10, rho=1)
    print(f"--- prox-al, eps = {eps:g}: {res.status}, {res.rounds['outer']} outer / "
          f"{res.rounds['communication']} rounds, {time.perf_counter() - t0:.1f} s")
    print(res.compare(ref), "\n")
