"""Why the constrained small-batch SSCA runs miss U (docs/ssca.md): seed 003's constrained
formulation (40) on the MNIST subset with B = 10 per client, over tau and schedules.

    OPENBLAS_NUM_THREADS=1 python benchmarks/ssca_constrained.py             # about 6 minutes
    OPENBLAS_NUM_THREADS=1 python benchmarks/ssca_constrained.py --diagnose  # about 2 minutes

``--diagnose``: B = 10 and 100 with the paper's rows, the true training loss against the
server's constraint surrogate at the iterate and how often the surrogate problem needs its
slack (``nu = c``), over rounds 500-1000.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from fedmodel.algorithms.driver import run_federated
from fedmodel.algorithms.ssca import run as ssca_run
from fedmodel.algorithms.ssca.options import SSCAOptions
from fedmodel.reproduce.ssca import C, U, build, mnist, run

CONFIGS = [
    (
        "paper: rho 0.9/t^0.1, gamma 0.5/t^0.1, tau 0.2",
        1000,
        dict(rho=(0.9, 0.1), gamma=(0.5, 0.1), tau=0.2),
    ),
    ("tau 1", 1000, dict(rho=(0.9, 0.1), gamma=(0.5, 0.1), tau=1.0)),
    ("tau 3", 1000, dict(rho=(0.9, 0.1), gamma=(0.5, 0.1), tau=3.0)),
    (
        "(4),(6) hold: rho 0.9/t^0.5, gamma 0.9/t^0.6, tau 0.2",
        1000,
        dict(rho=(0.9, 0.5), gamma=(0.9, 0.6), tau=0.2),
    ),
    (
        "rho 0.9/t^0.3, gamma 0.5/t^0.6, tau 0.2",
        1000,
        dict(rho=(0.9, 0.3), gamma=(0.5, 0.6), tau=0.2),
    ),
    ("tau 1, 3000 rounds", 3000, dict(rho=(0.9, 0.1), gamma=(0.5, 0.1), tau=1.0)),
    ("(4),(6) hold, tau 1, 3000 rounds", 3000, dict(rho=(0.9, 0.5), gamma=(0.9, 0.6), tau=1.0)),
]


def main() -> None:
    data = mnist(0)
    print("| setting | rounds | F(w_T) | ||w_T||^2 | test acc. |\n|---|---|---|---|---|")
    for name, T, kw in CONFIGS:
        t0 = time.time()
        model = build("sample", data, objective="norm", lam=0.0, bound=U)
        h = run(model, "ssca", 10, T, T, c=C, **kw)["res"].history[-1]
        print(
            f"| {name} | {T} | {h['train_loss']:.3f} | {h['norm_sq']:.1f} | "
            f"{h['test_accuracy']:.3f} |  <!-- {time.time() - t0:.0f} s -->",
            flush=True,
        )


def diagnose() -> None:
    data = mnist(0)
    print("| B | true F(w_t) | surrogate at w_t | rounds with nu = c |\n|---|---|---|---|")
    for B, rho, gamma, tau in (
        (10, (0.9, 0.1), (0.5, 0.1), 0.2),
        (100, (0.3, 0.1), (0.3, 0.1), 0.05),
    ):
        model = build("sample", data, objective="norm", lam=0.0, bound=U)
        opts = SSCAOptions(
            rounds=1000,
            batch_size=B,
            eval_every=20,
            keep_ledger=False,
            final_gradient=False,
            rho=rho,
            gamma=gamma,
            tau=tau,
            c=C,
        )
        opts.validate()
        factories, server = ssca_run._build(model, "ssca", opts)
        rows = []

        def watch(row, server=server, rows=rows):
            st, w = server.state, server.w
            surrogate = st.e[0] + st.F1[0] @ w + st.tau * w @ w
            rows.append((row["round"], row["train_loss"], surrogate, float(server.nu[0])))

        opts.callback = watch
        run_federated(None, opts, "ssca", server, factories)
        a = np.array(rows)
        late = a[a[:, 0] > 500]
        print(
            f"| {B} | {late[:, 1].mean():.3f} | {late[:, 2].mean():.3f} | "
            f"{np.mean(late[:, 3] >= C):.0%} |",
            flush=True,
        )


if __name__ == "__main__":
    diagnose() if "--diagnose" in sys.argv else main()
