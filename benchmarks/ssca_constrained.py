"""Why the constrained small-batch SSCA runs miss U (docs/ssca.md): seed 003's constrained
formulation (40) on the MNIST subset with B = 10 per client, over tau and schedules.

    OPENBLAS_NUM_THREADS=1 python benchmarks/ssca_constrained.py      # about 6 minutes
"""

from __future__ import annotations

import time

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


if __name__ == "__main__":
    main()
