"""The message table of ``prox-al`` and ``admm`` (Algorithm 1, Algorithm 2 and the Newton
inner solver): every kind the client half answers, its fields and what each reveals.

Dimensions: ``d`` (shared variables), ``d_own`` (the client's own block, never sent but in
the final report), ``m_ineq``, ``m_eq``, ``m_cone``, ``aa`` / ``oaa`` (the inner and
outer Anderson memories plus one, from the options) and ``cd`` (``curvature_directions``).

``inner_solver="prox-quasi-newton"`` (a non-smooth ``h`` with smooth parties) uses the
quasi-Newton kinds unchanged, ``inner="quasi-newton"`` included (``start``, ``outer``,
``gradient_w``, ``curvature_w``): a client reveals exactly what it reveals to the
quasi-Newton inner solver; ``h``, its prox and the server's model step never leave the
server.

Examples
--------
>>> PROXAL["admm_w"].reply["u_tilde"].shape
('d',)
"""

from __future__ import annotations

from fedmodel.algorithms.messages import W, evaluate_spec, report_spec
from fedmodel.runtime.schema import Field, MessageSpec, MessageTable

NEWTON = "inner_solver='newton'"
HESSIAN_METRIC = "penalty_metric='hessian'"
#: the party's own opt-in to send its d x d Hessian (fedmodel join --reveal hessian)
HESSIAN = "hessian"

# "admm" (default), "quasi-newton", "exact-admm" or "newton" (the Hessian: an opt-in)
_INNER = Field((), dtype="str", required=False, party_opt_in={"newton": HESSIAN})
_U_TILDE = Field(("d",), required=False, reveals="u~_i = u_i + lambda_i / rho_i (eq. 17)")
_METRIC = Field(
    ("d", "d"),
    required=False,
    opt_in=HESSIAN_METRIC,
    reveals="the Hessian of P_{i,k} (d x d curvature: with fewer rows than d it can reveal "
    "the rows)",
)
#: the derivatives of P_{i,k} at w (Newton inner solver)
_NEWTON_REPLY = {
    "value": Field((), required=False, reveals="P_{i,k}(w)"),
    "grad": Field(("d",), required=False, reveals="the gradient of P_{i,k} at w"),
    "hessian": Field(
        ("d", "d"),
        required=False,
        opt_in=NEWTON,
        reveals="the Hessian of P_{i,k} at w (d x d curvature: with fewer rows than d it "
        "can reveal the rows)",
    ),
}
#: quasi-Newton with curvature_directions > 0: directions out, Hessian-vector products back
_DIRECTIONS = Field(("<=cd", "d"), required=False)
_HVP = Field(
    ("<=cd", "d"),
    required=False,
    reveals="the Hessian of P_{i,k} at w times each direction (directional derivatives of "
    "its gradient; for a quadratic client the gradient difference along it)",
)
_STIFF = Field(
    ("*", "d"),
    required=False,
    reveals="the gradients at w, times sqrt(beta), of its equality constraints and active "
    "non-affine inequalities (constraint_curvature: their augmented-Lagrangian curvature "
    "J_i^T J_i; for affine equalities, its constraint rows themselves)",
)
#: the reply that starts the next inner solve: the ADMM initialisation or the derivatives
_INNER_START = {
    "u_tilde": _U_TILDE,
    "metric": _METRIC,
    **_NEWTON_REPLY,
    "hvp": _HVP,
    "stiff": _STIFF,
    "exact": Field((), dtype="bool", required=False, reveals="nothing (exact-admm started)"),
}
_START_ALTERNATIVES = (("u_tilde",), ("value", "grad"), ("exact",))
_GRAM = Field(("<=aa",), required=False, reveals="inner products of its ADMM residuals")
_OUTER_GRAM = Field(("<=oaa",), required=False, reveals="inner products of its multiplier changes")


def option_dims(options) -> dict[str, int]:
    """``aa`` / ``oaa``: the inner and outer Anderson memories plus one (the most weights
    and Gram entries a message carries)."""
    return {
        "aa": int(getattr(options, "anderson", 0)) + 1,
        "oaa": int(getattr(options, "outer_anderson", 0)) + 1,
        "cd": _curvature_bound(options),
    }


def _curvature_bound(options) -> int:
    """The most curvature directions a message carries (``curvature_directions``, or its
    default's largest value, 2)."""
    k = getattr(options, "curvature_directions", None)
    k = 2 if k is None else int(k)
    local = getattr(options, "local_directions", None)
    return k + 1 if local is None or local else k  # (the local direction on top)


PROXAL = MessageTable(
    "proxal",
    (
        MessageSpec(
            "start",
            request={"w": W, "inner": _INNER, "directions": _DIRECTIONS},
            reply={
                "newton": Field((), dtype="bool", required=False),
                "why": Field((), dtype="str", required=False),
                **_INNER_START,
            },
            one_of=(*_START_ALTERNATIVES, ("newton", "why")),
            reveals="the start of its inner solver at w^0",
        ),
        MessageSpec(
            "outer",
            request={"w": W, "inner": _INNER, "directions": _DIRECTIONS},
            reply={
                "dmu_inf": Field((), reveals="||mu_i^{k+1} - mu_i^k||_inf"),
                "violation": Field(
                    (),
                    required=False,
                    reveals="its largest constraint violation at w^{k+1} ((quasi-)Newton)",
                ),
                "complementarity": Field(
                    (),
                    required=False,
                    reveals="max_j mu_ij^{k+1} max(-c_ij(w^{k+1}), 0) ((quasi-)Newton)",
                ),
                "dtheta_scaled": Field((), required=False, reveals="the change of its block"),
                "gram": _OUTER_GRAM,
                **_INNER_START,
            },
            one_of=_START_ALTERNATIVES,
            reveals="the change of its multipliers and the next inner start",
            methods=("prox-al",),
        ),
        MessageSpec(
            "outer_aa",
            request={
                "w": W,
                "alpha": Field(("<=oaa",)),
                "reset": Field((), dtype="bool"),
                "inner": _INNER,
                "directions": _DIRECTIONS,
            },
            reply=_INNER_START,
            one_of=_START_ALTERNATIVES,
            reveals="the inner start at the combined point (outer Anderson step)",
            methods=("prox-al",),
        ),
        MessageSpec(
            "admm_w",
            request={
                "w": W,
                "tol": Field(()),
                "alpha": Field(("<=aa",), required=False),
                "reset": Field((), dtype="bool", required=False),
            },
            reply={
                "u_tilde": Field(("d",), reveals="u~_i = u_i + lambda_i / rho_i (eq. 17)"),
                "eps_tilde": Field((), reveals="its local accuracy (eq. 18)"),
                "rho": Field((), required=False, reveals="its residual-balanced rho_i"),
                "metric": _METRIC,
                "gram": _GRAM,
            },
            reveals="one ADMM round of Algorithm 2",
        ),
        MessageSpec(
            "xadmm_w",
            request={
                "c": Field(("d",)),
                "sigma": Field(()),
                "tol": Field(()),
                # seconds the step may take by the receiver's own clock (the run's
                # time_limit; absent without one)
                "budget": Field((), required=False),
            },
            reply={
                "x": Field(
                    ("d",),
                    reveals="x_i = argmin P_{i,k}(x) + (sigma/2)||x - c_i||^2, the prox of "
                    "its subproblem at the centre c_i",
                ),
            },
            reveals="one round of exact-admm (prox-al's inner solver on non-smooth and conic "
            "models: d floats)",
            methods=("prox-al",),
        ),
        MessageSpec(
            "gradient_w",
            request={"w": W},
            reply={
                "value": Field((), reveals="P_{i,k}(w)"),
                "grad": Field(("d",), reveals="the gradient of P_{i,k} at w"),
                "stiff": _STIFF,
            },
            reveals="P_{i,k}'s value and gradient at a trial point (quasi-Newton inner "
            "solver with curvature_directions = 0, its default above 500 shared variables: "
            "d + 1 floats, no curvature of its terms; with constraint_curvature, on up to "
            "2000 shared variables, the rows of its equality and active non-affine "
            "inequality constraints, d floats each)",
            methods=("prox-al",),
        ),
        MessageSpec(
            "curvature_w",
            request={
                "w": W,
                "directions": Field(("<=cd", "d")),
                "precondition": Field(("d",), required=False),
            },
            reply={
                "value": Field((), reveals="P_{i,k}(w)"),
                "grad": Field(("d",), reveals="the gradient of P_{i,k} at w"),
                "hvp": Field(("<=cd", "d"), reveals=_HVP.reveals),
                "stiff": _STIFF,
                "local_direction": Field(
                    ("d",),
                    required=False,
                    reveals="its local Newton direction (n (H_i + p I))^(-1) r for the "
                    "server's vector r (local_directions): one product of the inverse of "
                    "its Hessian of P_{i,k} at w, of the kind of a Hessian-vector product",
                ),
            },
            reveals="P_{i,k}'s value, gradient and Hessian-vector products along k = "
            "curvature_directions server-chosen directions at a trial point (the quasi-Newton "
            "default up to 500 shared variables, k = min(2, d // 4): (k + 1) d + 1 floats; "
            "the products of d / k rounds span the Hessian where it does not change, e.g. a "
            "quadratic client's; with local_directions, on by default when the server has "
            "no inequality constraints, one more direction and the client's local Newton "
            "direction: (k + 3) d + 1 floats; with constraint_curvature its constraint "
            "rows, d floats each)",
            methods=("prox-al",),
        ),
        MessageSpec(
            "newton_w",
            request={"w": W},
            reply={
                "value": Field((), reveals="P_{i,k}(w)"),
                "grad": Field(("d",), reveals="the gradient of P_{i,k} at w"),
                "hessian": _NEWTON_REPLY["hessian"],
            },
            reveals="P_{i,k}'s value and gradient at a trial point (Newton inner solver)",
            methods=("prox-al",),
            party_opt_in=HESSIAN,
        ),
        evaluate_spec(),
        report_spec(reply={"owned": Field(("d_own",), required=False, reveals="its own block")}),
    ),
    option_dims=option_dims,
    # ProxALClient's arguments besides its program and options
    build={
        "rho": Field((), positive=True),
        "n_clients": Field((), dtype="int", positive=True),
        "proximal": Field((), dtype="bool"),
        "theta0": Field(("d_own",), nullable=True),
        "metric": Field(
            (), dtype="str", choices=("scalar", "hessian"), party_opt_in={"hessian": HESSIAN}
        ),
    },
)
