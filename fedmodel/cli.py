"""The ``fedmodel`` command line.

Commands
--------
``fedmodel demo``
    Neyman-Pearson classification on the bundled breast cancer data over 5 clients:
    prox-al next to the centralized solve, and a convergence plot.
``fedmodel solve SCRIPT.py``
    Solve the model a script builds (a module-level ``model`` or a ``build()`` function).
``fedmodel reproduce NAME``
    Reproduce a seed paper's table or figure (``fedmodel reproduce --list``).
``fedmodel bench``
    Run the benchmark suite of a source checkout (``benchmarks/run.py``).
``fedmodel datasets``
    List the bundled data sets.

Long runs show a progress bar on stderr (tqdm when installed, else plain lines);
``--quiet`` silences it. Errors print one line ``fedmodel: error: ...`` and exit non-zero
(set ``FEDMODEL_DEBUG=1`` for the traceback of an unexpected error).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from fedmodel.progress import Progress, make_progress  # noqa: F401 - cli.make_progress

PROG = "fedmodel"

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_CHECKS = 3
EXIT_INTERRUPT = 130


class CLIError(Exception):
    """An error reported as one line ``fedmodel: error: ...``."""

    def __init__(self, message: str, code: int = EXIT_ERROR):
        super().__init__(message)
        self.code = code


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (no usage dump)."""

    def error(self, message: str):  # noqa: D401 - argparse API
        raise CLIError(f"{message} (see '{self.prog} --help')", EXIT_USAGE)


# -- helpers ----------------------------------------------------------------------------


def _parse_value(text: str) -> Any:
    """``1e-3`` -> float, ``[1, 2]`` -> list, ``True`` -> bool, ``none`` -> None, else str."""
    if text.lower() in ("none", "null"):
        return None
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _parse_options(items: list[str] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise CLIError(f"--option expects KEY=VALUE, got {item!r}", EXIT_USAGE)
        out[key] = _parse_value(value.strip())
    return out


def _one_line(text: str) -> str:
    return "; ".join(part.strip() for part in str(text).strip().splitlines() if part.strip())


def _plot_or_note(plot, path: Path, quiet: bool) -> Path | None:
    """Run ``plot(path)``; on a missing matplotlib print one line and return None."""
    try:
        plot(path)
    except ImportError as exc:
        print(f"note: no plot saved: {exc}", file=sys.stderr)
        return None
    return path


def _solve_with_progress(model, method: str, options: dict, quiet: bool):
    from fedmodel.algorithms.proxal.options import ProxALOptions

    opts = dict(options)
    takes_callback = False
    try:
        from fedmodel.algorithms.registry import all_methods

        spec = all_methods().get(method)
        takes_callback = spec is not None and "callback" in getattr(
            spec.options, "__dataclass_fields__", ProxALOptions.__dataclass_fields__
        )
    except Exception:  # pragma: no cover - registry always importable
        pass
    if not takes_callback or "callback" in opts:
        return model.solve(method=method, **opts)
    with Progress(method, enabled=not quiet) as progress:
        opts["callback"] = progress.callback
        return model.solve(method=method, **opts)


def _reference_method(model) -> str:
    """``centralized`` for convex models, ``cprox-al`` when the model has non-convex terms."""
    compiled = model.compile()
    return "cprox-al" if compiled.nonconvex else "centralized"


# -- commands ---------------------------------------------------------------------------


#: ``fedmodel demo --variant paper``: seed 000 Algorithms 1-2 with its Table 2 settings
_DEMO_PAPER_SETTINGS = {"variant": "paper", "beta": 300.0, "sbar": 1e-3, "rho": 0.01}


def _demo_plot_path(plot: str | None, variant: str) -> Path:
    """The demo's plot file: ``--plot`` if given, else one file per variant
    (``fedmodel-demo.png``, ``fedmodel-demo-paper.png``) so neither overwrites the other."""
    if plot is not None:
        return Path(plot)
    return Path("fedmodel-demo.png" if variant == "adaptive" else f"fedmodel-demo-{variant}.png")


def _demo_plot_title(variant: str, clients: int, status: str) -> str:
    """The demo plot's title: the problem, which prox-al variant, the clients, the status."""
    how = (
        "prox-al as published (seed 000 Alg. 1-2, Table 2 settings)"
        if variant == "paper"
        else "prox-al at its defaults (adaptive)"
    )
    return f"Neyman-Pearson on breast cancer, {clients} clients\n{how}: {status}"


def cmd_demo(args) -> int:
    import numpy as np

    from fedmodel.datasets import load_breast_cancer, split_by_class, split_stratified
    from fedmodel.models import neyman_pearson_model

    ds = load_breast_cancer()
    parts = split_stratified(ds.X, ds.y, args.clients, random_state=args.seed)
    sites = []
    for X, y in parts:
        by = split_by_class(X, y)
        sites.append((by[0], by[1]))
    model = neyman_pearson_model(sites, r=args.r)
    print(
        f"Neyman-Pearson classification on breast cancer ({ds.n_samples} rows, "
        f"{ds.n_features} features incl. intercept) over {args.clients} clients "
        f"(stratified split, seed {args.seed}):\n"
        f"  minimize the class-0 logistic loss s.t. every client's class-1 loss <= {args.r:g}\n"
        + (
            f"  prox-al as published, seed 000 Table 2's settings: {_DEMO_PAPER_SETTINGS}"
            if args.variant == "paper"
            else "  prox-al at its defaults (variant='adaptive')"
        )
        + f", eps = {args.eps:g}"
    )
    settings = _DEMO_PAPER_SETTINGS if args.variant == "paper" else {}
    t0 = time.perf_counter()
    res = _solve_with_progress(model, "prox-al", {"eps": args.eps, **settings}, args.quiet)
    t_fed = time.perf_counter() - t0
    t0 = time.perf_counter()
    ref = model.solve(method="centralized")
    t_ref = time.perf_counter() - t0
    print()
    print(res.compare(ref))
    print(f"status: prox-al {res.status}, centralized {ref.status}")
    print(
        f"prox-al: {res.rounds.get('outer')} outer iterations "
        f"(inner solver: {res.extra.get('inner_solver', 'admm')}), "
        f"{res.rounds.get('communication')} communication rounds, "
        f"{res.communication.get('floats_up', 0) + res.communication.get('floats_down', 0)} "
        f"floats sent; wall time {t_fed:.2f} s (centralized {t_ref:.2f} s)"
    )
    losses = []
    for _, X1 in sites:
        z = X1 @ res.x
        losses.append(float(np.mean(np.logaddexp(0.0, -z))))
    print(
        f"class-1 loss per client: min {min(losses):.4f}, max {max(losses):.4f} (bound {args.r:g})"
    )
    if not args.no_plot:
        path = _demo_plot_path(args.plot, args.variant)
        title = _demo_plot_title(args.variant, args.clients, res.status)
        saved = _plot_or_note(
            lambda p: res.plot(reference=ref, path=p, title=title), path, args.quiet
        )
        if saved is not None:
            print(f"convergence plot: {saved.resolve()}")
    return 0


def _load_script_model(path: Path):
    import runpy

    import fedmodel as fm

    if not path.is_file():
        raise CLIError(f"no such script: {path}")
    script_dir = str(path.resolve().parent)
    sys.path.insert(0, script_dir)
    try:
        namespace = runpy.run_path(str(path), run_name="__fedmodel_script__")
        if isinstance(namespace.get("model"), fm.Model):
            return namespace["model"]
        build = namespace.get("build")
        if callable(build):
            model = build()
            if not isinstance(model, fm.Model):
                raise CLIError(
                    f"{path.name}: build() returned {type(model).__name__}, not a fedmodel.Model"
                )
            return model
    except (CLIError, fm.FedModelError):
        raise
    except SystemExit as exc:
        raise CLIError(
            f"{path.name} called sys.exit({exc.code}) while building the model"
        ) from None
    except Exception as exc:
        frames = [
            f
            for f in traceback.extract_tb(exc.__traceback__)
            if Path(f.filename).resolve() == path.resolve()
        ]
        where = f" (line {frames[-1].lineno})" if frames else ""
        raise CLIError(
            f"{path.name}{where} raised {type(exc).__name__}: {_one_line(exc)}"
        ) from None
    finally:
        if sys.path and sys.path[0] == script_dir:
            sys.path.pop(0)
    raise CLIError(
        f"{path.name} defines neither a module-level 'model' (a fedmodel.Model) nor a "
        "'build()' function returning one"
    )


def cmd_solve(args) -> int:
    path = Path(args.script)
    model = _load_script_model(path)
    from fedmodel.algorithms.dp import privacy_from_plain

    options = privacy_from_plain(_parse_options(args.option))
    if args.eps is not None:
        options["eps"] = args.eps
    t0 = time.perf_counter()
    res = _solve_with_progress(model, args.method, options, args.quiet or args.json)
    wall = time.perf_counter() - t0
    ref = None
    if args.compare:
        ref_method = _reference_method(model)
        if ref_method != args.method:
            ref = model.solve(method=ref_method)
    if args.plot:
        _plot_or_note(lambda p: res.plot(reference=ref, path=p), Path(args.plot), args.quiet)
    if args.json:
        record = res.to_dict()
        record["wall_seconds"] = wall
        if ref is not None:
            record["comparison"] = res.compare(ref).to_dict()
        print(json.dumps(record, indent=2))
    else:
        print(f"model: {model.name} ({len(model.clients)} clients), method: {res.method}")
        print(f"status: {res.status}" + (f" - {res.message}" if res.message else ""))
        print(f"objective: {res.objective:.10g}")
        print(f"max violation: {res.max_violation:.3e}")
        if res.kkt is not None:
            print(
                f"KKT residuals: stationarity {res.kkt.stationarity:.3e}, "
                f"feasibility {res.kkt.feasibility:.3e}"
            )
        if res.rounds:
            print("rounds: " + ", ".join(f"{k} {v}" for k, v in res.rounds.items()))
        if res.privacy.get("secure_aggregation", {}).get("on") or res.privacy.get("accountant"):
            from fedmodel.algorithms.dp import describe

            print("privacy: " + describe(res.privacy))
        print(f"wall time: {wall:.2f} s")
        for name, value in res.solution.items():
            import numpy as np

            arr = np.asarray(value)
            shown = np.array2string(arr.ravel()[:8], precision=4, separator=", ")
            more = f" ... ({arr.size} entries)" if arr.size > 8 else ""
            print(f"{name} = {shown}{more}")
        if ref is not None:
            print()
            print(res.compare(ref))
    return 0 if res.status == "optimal" or not args.strict else EXIT_ERROR


def cmd_reproduce(args) -> int:
    from fedmodel import reproduce
    from fedmodel.reproduce.output import check_mark, verdict

    names = reproduce.available()
    if args.list or not args.name:
        if not args.name and not args.list:
            raise CLIError("reproduce needs a NAME; available: " + ", ".join(names), EXIT_USAGE)
        for name in names:
            doc = (reproduce.REPRODUCTIONS[name].__doc__ or "").strip().splitlines()
            print(f"{name:<14} {doc[0] if doc else ''}")
        return 0
    if args.name not in names:
        raise CLIError(
            f"unknown reproduction {args.name!r}; available: {', '.join(names)}", EXIT_USAGE
        )
    if args.trials is not None and args.trials < 1:
        raise CLIError(f"--trials must be >= 1, got {args.trials}", EXIT_USAGE)
    out = Path(args.out) if args.out else Path("fedmodel-reproduce") / args.name
    out.mkdir(parents=True, exist_ok=True)
    kw = _parse_options(args.set)
    if args.rho is not None:
        kw["rho"] = args.rho
    if args.time_limit is not None:
        kw["time_limit"] = args.time_limit
    default_trials = getattr(reproduce.REPRODUCTIONS[args.name], "default_trials", None)
    trials = (
        args.trials if args.trials is not None else (3 if args.quick else (default_trials or 10))
    )
    t0 = time.perf_counter()
    summary = reproduce.run(
        args.name, out_dir=out, trials=trials, quick=args.quick, progress=not args.quiet, **kw
    )
    wall = time.perf_counter() - t0
    summary = summary or {}
    markdown = summary.get("markdown")
    if markdown:
        md_path = Path(markdown)
        if md_path.is_file():
            print(md_path.read_text())
    files = summary.get("files") or sorted(str(p) for p in out.iterdir())
    print(f"{args.name}: {wall:.1f} s; files in {out.resolve()}:")
    for f in files:
        print(f"  {f}")
    checks = summary.get("checks") or []
    for c in checks:
        print(f"  [{check_mark(c)}] {c.get('name')}: {c.get('detail', '')}")
    outcome = verdict(checks)
    if outcome == "fail":
        failed = [c for c in checks if check_mark(c) == "FAIL"]
        print(f"{PROG}: {len(failed)} of {len(checks)} checks failed", file=sys.stderr)
        return EXIT_CHECKS
    if outcome == "inconclusive":
        cut = [c for c in checks if check_mark(c) == "INCONCLUSIVE"]
        print(
            f"{args.name}: inconclusive: {len(cut)} of {len(checks)} checks failed on runs "
            "stopped by their time limit (no verdict on the paper's claim; rerun without "
            "--time-limit or on a less busy machine)"
        )
    return 0


def _find_bench() -> Path | None:
    candidates = []
    cwd = Path.cwd().resolve()
    candidates += [d / "benchmarks" / "run.py" for d in (cwd, *cwd.parents)]
    candidates.append(Path(__file__).resolve().parents[1] / "benchmarks" / "run.py")
    for c in candidates:
        if c.is_file():
            return c
    return None


def cmd_bench(args) -> int:
    script = _find_bench()
    if script is None:
        raise CLIError(
            "no benchmark suite found: 'fedmodel bench' runs benchmarks/run.py of a source "
            "checkout (the installed package does not ship it); run it from a clone of the "
            "repository"
        )
    cmd = [sys.executable, str(script), *args.bench_args]
    if not args.quiet:
        print(f"running {' '.join(cmd)}", file=sys.stderr)
    return subprocess.call(cmd, cwd=str(script.parents[1]))


def cmd_datasets(args) -> int:
    from fedmodel.datasets import list_datasets

    rows = list_datasets()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    header = ("name", "rows", "test rows", "features", "task", "licence")
    table = [header] + [
        (
            d["name"],
            str(d["rows"]),
            "-" if d["test_rows"] is None else str(d["test_rows"]),
            str(d["features"]),
            d["task"],
            str(d["licence"]),
        )
        for d in rows
    ]
    widths = [max(len(r[i]) for r in table) for i in range(len(header) - 1)]
    for r in table:
        cells = [
            f"{c:<{w}}" if i == 0 or i >= 4 else f"{c:>{w}}"
            for i, (c, w) in enumerate(zip(r[:-1], widths))
        ]
        print("  ".join(cells + [r[-1]]))
    print(
        "load with fedmodel.datasets.load(NAME); preprocessing and provenance in each "
        "loader's docstring"
    )
    return 0


# -- parser and entry point ---------------------------------------------------------------


def cmd_join(args) -> int:
    from fedmodel.flower_app import join

    return join(
        args.model,
        args.party,
        args.data,
        args.superlink,
        insecure=args.insecure,
        root_certificates=args.root_certificates,
        auth_key=args.auth_key,
        socket_dir=args.socket_dir,
        ready_file=args.ready_file,
        checkpoint_dir=args.checkpoint_dir,
        reveal=tuple(args.reveal or ()),
    )


def cmd_serve(args) -> int:
    from fedmodel.flower_app import serve

    out = serve(
        args.model,
        args.method,
        _parse_options(args.option),
        args.superlink,
        args.out,
        args.ledger,
        insecure=args.insecure,
        root_certificates=args.root_certificates,
        authorized_keys=args.authorized_keys,
        wait=args.wait,
        timeout=args.timeout,
        progress=not args.quiet,
    )
    print(f"{out['status']}: {out['message']}")
    print(f"result written to {args.out}" + (f", ledger to {args.ledger}" if args.ledger else ""))
    return EXIT_INTERRUPT if out["status"] == "interrupted" else 0


def cmd_register(args) -> int:
    from fedmodel.deploy import load_model_file
    from fedmodel.flower_app import read_authorized_keys, register_parties, transport_security

    transport_security("register", args.insecure, args.root_certificates)
    keys = read_authorized_keys(args.authorized_keys, load_model_file(args.model).parties)
    nodes = register_parties(
        args.superlink, keys, insecure=args.insecure, root_certificates=args.root_certificates
    )
    for party, node in nodes.items():
        print(f"{party}: node {node}")
    return 0


def _flower_arguments(p) -> None:
    p.add_argument("model", metavar="MODEL.py", help="the shared model file (docs/deployment.md)")
    p.add_argument(
        "--insecure", action="store_true", help="no TLS (loopback tests, development only)"
    )
    p.add_argument(
        "--root-certificates",
        "--root-cert",
        metavar="PEM",
        help="CA certificate of the SuperLink's TLS certificate (default: the system's roots)",
    )


def build_parser() -> argparse.ArgumentParser:
    common = _Parser(add_help=False)
    common.add_argument(
        "-q", "--quiet", action="store_true", default=argparse.SUPPRESS, help="no progress bar"
    )
    parser = _Parser(
        prog=PROG,
        description="Federated optimization with constraints: solve, reproduce, benchmark.",
        parents=[common],
    )
    from fedmodel import __version__

    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    p = sub.add_parser(
        "demo", parents=[common], help="Neyman-Pearson on breast cancer, prox-al vs centralized"
    )
    p.add_argument("--clients", type=int, default=5, help="number of clients (default 5)")
    p.add_argument("--r", type=float, default=0.2, help="class-1 loss bound (default 0.2)")
    p.add_argument("--eps", type=float, default=1e-3, help="KKT tolerance (default 1e-3)")
    p.add_argument("--seed", type=int, default=0, help="split seed (default 0)")
    p.add_argument(
        "--variant",
        choices=("adaptive", "paper"),
        default="adaptive",
        help="prox-al's defaults (adaptive) or seed 000's Algorithms 1-2 with its Table 2 "
        "settings (paper)",
    )
    p.add_argument(
        "--plot",
        default=None,
        help="where to save the convergence plot (default fedmodel-demo.png, "
        "fedmodel-demo-paper.png with --variant paper)",
    )
    p.add_argument("--no-plot", action="store_true", help="do not save a plot")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser(
        "solve", parents=[common], help="solve the model built by SCRIPT.py ('model' or 'build()')"
    )
    p.add_argument("script", metavar="SCRIPT.py")
    p.add_argument(
        "--method", default="prox-al", help="prox-al (default), cprox-al, admm, centralized, ..."
    )
    p.add_argument("--eps", type=float, default=None, help="KKT tolerance")
    p.add_argument(
        "--option",
        "-o",
        action="append",
        metavar="KEY=VALUE",
        help="a method option, e.g. -o beta=300 -o rho=0.01 (repeatable)",
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument(
        "--compare",
        action="store_true",
        help="also solve the reference (centralized, or cprox-al if non-convex) "
        "and print the comparison",
    )
    p.add_argument("--plot", metavar="PATH", help="save a convergence plot (PNG)")
    p.add_argument("--strict", action="store_true", help="exit 1 unless the status is 'optimal'")
    p.set_defaults(func=cmd_solve)

    p = sub.add_parser(
        "reproduce", parents=[common], help="reproduce a seed paper's table or figure"
    )
    p.add_argument("name", nargs="?", metavar="NAME", help="e.g. table2 (see --list)")
    p.add_argument("--list", action="store_true", help="list the reproductions")
    p.add_argument(
        "--trials", type=int, default=None, help="random trials (default 10, 3 with --quick)"
    )
    p.add_argument(
        "--quick", action="store_true", help="small, fast version with checks (3 trials, n <= 5)"
    )
    p.add_argument("--out", metavar="DIR", help="output folder (default fedmodel-reproduce/NAME)")
    p.add_argument(
        "--rho",
        type=float,
        default=None,
        help="override the ADMM penalty rho of the paper's setting",
    )
    p.add_argument(
        "--time-limit",
        type=float,
        default=None,
        help="seconds allowed per solve (default: the reproduction's own)",
    )
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="further keyword for the reproduction (repeatable)",
    )
    p.set_defaults(func=cmd_reproduce)

    p = sub.add_parser(
        "bench", parents=[common], help="run the benchmark suite (benchmarks/run.py of a checkout)"
    )
    p.add_argument("bench_args", nargs=argparse.REMAINDER, help="passed to benchmarks/run.py")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser(
        "join", parents=[common], help="serve one party of a Flower deployment (its data only)"
    )
    _flower_arguments(p)
    p.add_argument("--party", required=True, help="the party this organisation runs")
    p.add_argument("--data", required=True, metavar="FILE", help="the party's own data file")
    p.add_argument(
        "--superlink", required=True, metavar="HOST:PORT", help="the SuperLink's Fleet API"
    )
    p.add_argument(
        "--auth-key",
        metavar="KEY",
        help="the party's private key (OpenSSH ECDSA) its SuperNode authenticates with",
    )
    p.add_argument(
        "--checkpoint-dir",
        metavar="DIR",
        help="where the party writes its checkpoint files (default fedmodel-checkpoints/PARTY)",
    )
    p.add_argument(
        "--socket-dir",
        metavar="DIR",
        help="where the party's local socket lives (created 0700; an existing one must be "
        "private to this user)",
    )
    p.add_argument(
        "--reveal",
        action="append",
        metavar="OPT_IN",
        help="enable an opt-in: what this party may reveal beyond its method's default "
        "messages (hessian: its d x d Hessian, for prox-al's inner_solver=newton and "
        "penalty_metric=hessian); repeat for several; none by default",
    )
    p.add_argument("--ready-file", metavar="FILE", help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_join)

    p = sub.add_parser("serve", parents=[common], help="coordinate a solve over a Flower SuperLink")
    _flower_arguments(p)
    p.add_argument("--method", default="prox-al", help="a federated method (default prox-al)")
    p.add_argument("--option", "-o", action="append", metavar="KEY=VALUE", help="a method option")
    p.add_argument(
        "--superlink", required=True, metavar="HOST:PORT", help="the SuperLink's Control API"
    )
    p.add_argument("--out", default="result.json", help="Result JSON (default result.json)")
    p.add_argument("--ledger", metavar="FILE", help="write the ledger (JSON lines) here")
    p.add_argument(
        "--authorized-keys",
        metavar="FILE",
        help="the parties' public keys ('PARTY ecdsa-sha2-... KEY' lines): registered with the "
        "SuperLink, each party accepted only from the node holding its key",
    )
    p.add_argument("--wait", type=float, default=120.0, help="seconds to wait for the parties")
    p.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds for the whole run: the solve stops there with status time_limit, its "
        "last point and a checkpoint (checkpoint=, default OUT.checkpoint)",
    )
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser(
        "register",
        parents=[common],
        help="register the parties' public keys with a SuperLink (SuperNode authentication)",
    )
    _flower_arguments(p)
    p.add_argument(
        "--superlink", required=True, metavar="HOST:PORT", help="the SuperLink's Control API"
    )
    p.add_argument(
        "--authorized-keys", required=True, metavar="FILE", help="the parties' public keys"
    )
    p.set_defaults(func=cmd_register)

    p = sub.add_parser("datasets", parents=[common], help="list the bundled data sets")
    p.add_argument("--json", action="store_true", help="print as JSON")
    p.set_defaults(func=cmd_datasets)
    return parser


def _error(message: str, code: int) -> int:
    print(f"{PROG}: error: {_one_line(message)}", file=sys.stderr)
    return code


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``fedmodel`` console script; returns the exit code."""
    from fedmodel.errors import FedModelError

    try:
        parser = build_parser()
        argv = list(sys.argv[1:] if argv is None else argv)
        bench_args: list[str] | None = None
        if "bench" in argv:  # everything after 'bench' goes to benchmarks/run.py verbatim
            i = argv.index("bench")
            if all(a.startswith("-") for a in argv[:i]):
                argv, bench_args = argv[: i + 1], argv[i + 1 :]
        args = parser.parse_args(argv)
        if bench_args is not None:
            args.bench_args = bench_args
        if not getattr(args, "quiet", False):
            args.quiet = False
        if args.command is None:
            parser.print_help()
            return EXIT_USAGE
        return int(args.func(args) or 0)
    except CLIError as exc:
        return _error(str(exc), exc.code)
    except FedModelError as exc:
        return _error(str(exc), EXIT_ERROR)
    except SystemExit as exc:  # --help / --version
        return exc.code if isinstance(exc.code, int) else EXIT_ERROR
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPT
    except (OSError, ValueError, KeyError, ImportError) as exc:
        if os.environ.get("FEDMODEL_DEBUG"):
            traceback.print_exc()
        msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        return _error(f"{msg}", EXIT_ERROR)
    except Exception as exc:
        if os.environ.get("FEDMODEL_DEBUG"):
            traceback.print_exc()
        return _error(
            f"unexpected {type(exc).__name__}: {exc} (set FEDMODEL_DEBUG=1 for the traceback)",
            EXIT_ERROR,
        )


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
