"""Scaling in the number of clients and in the dimension: prox-al at its defaults against
the arithmetic it cannot avoid, next to fedmodel's centralized solve and a plain Clarabel
solve of the pooled problem.

    python benchmarks/scaling.py                 # every case (clients 10 .. 10,000, d 10 .. 10,000)
    python benchmarks/scaling.py --quick         # the small cases only
    python benchmarks/scaling.py --cases ls-box-n1000,logistic-ball-n1000 --time-limit 120
    python benchmarks/scaling.py --profile ls-box-n1000      # cProfile of one prox-al solve
    python benchmarks/scaling.py --cases ls-box-n1000 --options '{"participation": 0.1}' ...
    PYTHONPATH=../other-checkout python benchmarks/scaling.py --label before ...   # another checkout

The cases:

* ``ls-box-n{N}``: least squares over N clients (d = 20, 20 to 50 rows each, the loss
  divided by the pooled row count), a server box ``|w| <= 0.5`` (active);
* ``logistic-ball-n{N}``: logistic loss on the same layout, a server l2 ball
  ``||w|| <= 0.5`` (active);
* ``logistic-ball-d{D}``: 10 clients of 50 rows, d = D (the dimension sweep);
* ``lcqp-d500``: seed 000 Table 1's largest instance (n = 10 clients, d = 500, m = 5),
  prox-al at its defaults, as every case here (Table 1's settings, ``sbar = 0.1`` ...,
  are ``benchmarks/proxal_vs_paper.py``'s);
* ``lcqp-d2000``: the same generator at d = 2000 (the compile against the solve).

Each (case, method) runs in a forked child (its peak resident memory is the child's
``VmHWM``), with the method's ``time_limit`` and a hard kill at three times it. The
prox-al row also holds:

* ``compile``: ``model.compile()`` seconds (the first compile of the model), and
  ``setup``: the solve's own set-up before its first round (the parties' evaluators and
  subproblems, the runtime), inside ``wall``;
* ``necessary``: the clients' necessary linear algebra per round, timed in the same child:
  one ``X^T (X w)`` with every data matrix of every client (the best of a few sweeps);
* ``moved``: the bytes a round moves, timed in the same child: every message each client
  sent and received in the solve (both channels, the ledger's counts and floats) encoded to
  bytes and decoded back once (``ndarray.tobytes``, ``np.frombuffer``: the least a
  transport does with a message), over the rounds (the best of a few sweeps);
* ``per round``: the solve's CPU seconds (``time.process_time`` of the child: the serial
  runtime runs every party in it) over its rounds; ``ratio``: that over ``necessary``, and
  ``ratio with bytes``: that over ``necessary + moved`` (CPU seconds too: on a shared
  machine wall clocks measure the other tenants);
* ``setup share``: the solve's set-up over its wall;
* ``--repeats N``: each prox-al solve runs N times, each in its own child; the row is the
  run of median ``ratio with bytes`` and keeps every run's ratio (``ratio_with_bytes_runs``),
  shown as their range next to the median;
* ``bytes per client-round``: the mean client's sent and received floats (algorithm and
  monitoring channels), 8 bytes each, over the rounds.

The gap is ``(f(x) - f*) / max(1, |f*|)`` with ``f*`` the Clarabel optimum of the pooled
problem in the same run, and the violation the largest relative violation of the pooled
constraints at the returned point (the judge of ``benchmarks/models.py``).

Results: ``benchmarks/results_scaling.json`` (every row, keyed by case, method and
``--label``; a run replaces the rows it ran) and ``benchmarks/RESULTS_scaling.md`` (written
from the json by every run).
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402

import cvxpy as cp  # noqa: E402
import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

from models import Case, judge, run_forked  # noqa: E402

import fedmodel as fm  # noqa: E402

JSON = HERE / "results_scaling.json"
MD = HERE / "RESULTS_scaling.md"


# ----------------------------------------------------------------------------------------
# The cases
# ----------------------------------------------------------------------------------------
def _shards(n: int, d: int, rows: tuple[int, int], seed: int, kind: str):
    """``n`` clients' (X, y), ``rows`` rows each (uniform in the closed range)."""
    rng = np.random.default_rng(seed)
    w0 = rng.normal(size=d)
    parts = []
    for _ in range(n):
        k = int(rng.integers(rows[0], rows[1] + 1))
        X = rng.normal(size=(k, d))
        margin = X @ w0
        if kind == "ls":
            y = margin + 0.3 * rng.normal(size=k)
        else:
            y = np.where(margin + 0.5 * rng.normal(size=k) > 0, 1.0, -1.0)
        parts.append((X, y))
    return parts


def _glm_case(name, kind, n, d, rows, server_cons, federated=True) -> Case:
    """Client k minimises its loss over the pooled row count; the pooled problem is the
    same loss over the stacked rows (written stacked: one cvxpy term)."""
    parts = _shards(n, d, rows, seed=n + 7 * d, kind=kind)
    N = sum(len(y) for _, y in parts)
    W = cp.Variable(d, name="w")

    def loss(X, y, v):
        if kind == "ls":
            return cp.sum_squares(X @ v - y) / N
        return cp.sum(cp.logistic(-cp.multiply(y, X @ v))) / N

    m = fm.Model(name)
    if federated:
        w = m.variable(d, name="w")
        for k, (X, y) in enumerate(parts):
            c = m.client(f"c{k}")
            c.minimize(loss(c.data(X, name="X"), c.data(y, name="y"), w), name="loss")
        m.server.subject_to(server_cons(w))
    Xs, ys = np.vstack([X for X, _ in parts]), np.concatenate([y for _, y in parts])
    pooled = cp.Problem(cp.Minimize(loss(Xs, ys, W)), server_cons(W))
    case = Case(m, pooled, {"w": W}, n, f"{kind} d={d}")
    case.extra["matrices"] = [[X] for X, _ in parts]
    return case


def _box(w):
    return [w <= 0.5, w >= -0.5]


def _ball(w):
    return [cp.norm(w, 2) <= 0.5]


def _lcqp_case(d: int) -> Case:
    from fedmodel.models import lcqp_instance, lcqp_model

    inst = lcqp_instance(n=10, d=d, m=5, random_state=0)
    model = lcqp_model(inst)
    W = cp.Variable(d, name="w")
    obj = sum(0.5 * cp.quad_form(W, A, assume_PSD=True) + b @ W for A, b in zip(inst.A, inst.b))
    cons = [C @ W + dd == 0 for C, dd in zip(inst.C, inst.d)]
    case = Case(model, cp.Problem(cp.Minimize(obj), cons), {"w": W}, 10, f"lcqp d={d}")
    case.extra["matrices"] = [[A, C] for A, C in zip(inst.A, inst.C[1:])]
    return case


def build(name: str, federated: bool = True) -> Case:
    """The case ``name``; ``federated=False`` leaves the fedmodel model empty (the judge
    needs the pooled problem only)."""
    kind, _, size = name.rpartition("-")
    value = int(size[1:])
    if kind == "ls-box" and size[0] == "n":
        return _glm_case(name, "ls", value, 20, (20, 50), _box, federated)
    if kind == "logistic-ball" and size[0] == "n":
        return _glm_case(name, "logistic", value, 20, (20, 50), _ball, federated)
    if kind == "logistic-ball" and size[0] == "d":
        return _glm_case(name, "logistic", 10, value, (50, 50), _ball, federated)
    if kind == "lcqp" and size[0] == "d":
        return _lcqp_case(value)
    raise ValueError(f"unknown case {name!r}")


CLIENTS = (10, 100, 1000, 10_000)
DIMS = (10, 100, 1000, 10_000)
FULL = (
    [f"{m}-n{n}" for n in CLIENTS for m in ("ls-box", "logistic-ball")]
    + [f"logistic-ball-d{d}" for d in DIMS]
    + ["lcqp-d500", "lcqp-d2000"]
)
QUICK = ["ls-box-n10", "logistic-ball-n10", "ls-box-n100", "logistic-ball-n100"]
QUICK += ["logistic-ball-d100", "lcqp-d500"]
METHODS = ("prox-al", "centralized", "clarabel")


# ----------------------------------------------------------------------------------------
# Measuring
# ----------------------------------------------------------------------------------------
def _vm_hwm_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return float(line.split()[1]) / 1024
    return float("nan")


def necessary_seconds(matrices: list[list[np.ndarray]], d: int, sweeps: int = 5) -> float:
    """One ``X^T (X w)`` with every data matrix of every client: the best of ``sweeps``."""
    w = np.random.default_rng(0).normal(size=d)
    best = np.inf
    for _ in range(sweeps):
        t0 = time.process_time()
        for mats in matrices:
            for X in mats:
                X.T @ (X @ w)
        best = min(best, time.process_time() - t0)
    return best


def client_message_sizes(comm: dict) -> list[int]:
    """The floats of every message a client sent or received in a solve (``comm``: its
    ledger's ``communication``, both channels; a client's messages in one direction of one
    channel taken of equal size): each message once, from its client's side."""
    sizes: list[int] = []
    for channel in (comm, comm.get("diagnostic", {})):
        for party, v in channel.get("per_party", {}).items():
            if party == "server":
                continue
            for way in ("sent", "received"):
                count, floats = v[f"messages_{way}"], v[f"floats_{way}"]
                if count:
                    sizes += [round(floats / count)] * count
    return sizes


def moved_seconds(comm: dict, rounds: int, sweeps: int = 5) -> float:
    """The bytes of one round moved: every client's message of the solve
    (:func:`client_message_sizes`) encoded to bytes and decoded back once, over ``rounds``
    (the best of ``sweeps``); NaN without rounds or messages."""
    sizes = client_message_sizes(comm)
    if not rounds or not sizes:
        return float("nan")
    payloads = {k: np.random.default_rng(k).normal(size=k) for k in set(sizes)}
    messages = [payloads[k] for k in sizes]
    best = np.inf
    for _ in range(sweeps):
        t0 = time.process_time()
        round_trip(messages)
        best = min(best, time.process_time() - t0)
    return best / rounds


def round_trip(messages: list[np.ndarray]) -> int:
    """Each of ``messages`` encoded to bytes and decoded back (``tobytes``,
    ``np.frombuffer``: the least a transport does with a message); the bytes decoded."""
    decoded = 0
    for payload in messages:
        decoded += np.frombuffer(payload.tobytes(), dtype=np.float64).nbytes
    return decoded


def _bytes_per_client_round(comm: dict, rounds: int) -> float:
    if not rounds:
        return float("nan")
    total = []
    for channel in (comm, comm.get("diagnostic", {})):
        for party, v in channel.get("per_party", {}).items():
            if party != "server":
                total.append(v["floats_sent"] + v["floats_received"])
    clients = len([p for p in comm.get("per_party", {}) if p != "server"]) or 1
    return 8.0 * sum(total) / clients / rounds


def _profile_lines(prof, top: int = 30) -> list[str]:
    import io
    import pstats

    from cases import short_paths

    out = []
    for key in ("tottime", "cumulative"):
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats(key).print_stats(top)
        lines = [ln for ln in buf.getvalue().splitlines() if ln.strip()]
        start = next(i for i, ln in enumerate(lines) if ln.lstrip().startswith("ncalls"))
        out += [f"-- by {key}"] + [short_paths(ln) for ln in lines[start:]]
    return out


def run_one(
    name: str, method: str, time_limit: float, profile: bool = False, options: dict | None = None
) -> dict:
    t0 = time.perf_counter()
    case = build(name, federated=method != "clarabel")
    row = {
        "case": name,
        "method": method,
        "n": case.n_clients,
        "d": int(case.variables["w"].size),
        "build": time.perf_counter() - t0,
    }
    if method == "clarabel":
        t0 = time.perf_counter()
        try:
            case.pooled.solve(solver="CLARABEL", time_limit=time_limit)
            row["status"] = case.pooled.status
        except cp.error.SolverError as exc:
            row["status"] = f"solver_error: {str(exc)[:80]}"
        row["wall"] = time.perf_counter() - t0
        row["f_star"] = float(case.pooled.value) if row["status"] == "optimal" else np.nan
        if row["status"] == "optimal":
            w = np.asarray(case.variables["w"].value)
            row["w_norm"] = float(np.linalg.norm(w))
            row["w_inf"] = float(np.abs(w).max())
        row["peak_mb"] = _vm_hwm_mb()
        return row
    c0 = time.process_time()
    case.model.compile()
    row["compile"] = time.process_time() - c0
    settings = dict(case.extra.get("settings", {})) if method == "prox-al" else {}
    if method == "prox-al":
        settings.update(options or {})
    row["settings"] = settings
    prof = None
    if profile:
        import cProfile

        prof = cProfile.Profile(
            time.process_time
        )  # CPU seconds: a busy machine's waits not counted
        prof.enable()
    t0, c0 = time.perf_counter(), time.process_time()
    res = case.model.solve(method=method, time_limit=time_limit, **settings)
    row["wall"] = time.perf_counter() - t0
    row["cpu"] = time.process_time() - c0
    if prof is not None:
        prof.disable()
        row["profile"] = _profile_lines(prof)
    row["peak_mb"] = _vm_hwm_mb()
    row["status"] = res.status
    row["message"] = (res.message or "")[:300]
    rounds = int((res.rounds or {}).get("communication", 0))
    row["rounds"] = rounds
    row["timing"] = {k: v for k, v in res.timing.items() if isinstance(v, float)}
    row["setup"] = float(res.timing.get("compile", np.nan))
    extra = res.extra or {}
    row["inner_solver"] = extra.get("inner_solver", "")
    row["outer"] = int((res.rounds or {}).get("outer", 0))
    row["anderson_rejections"] = extra.get("anderson_rejections")
    row["participation"] = extra.get("participation")
    rho = extra.get("rho")
    if isinstance(rho, dict) and rho:
        values = np.array([float(np.mean(v)) for v in rho.values()])
        row["rho_range"] = [float(values.min()), float(values.max())]
    row["solution"] = np.asarray(res.solution.get("w")).tolist()
    if method == "prox-al":
        row["bytes_per_client_round"] = _bytes_per_client_round(res.communication, rounds)
        row["necessary"] = necessary_seconds(case.extra["matrices"], row["d"])
        row["moved"] = moved_seconds(res.communication, rounds)
        if rounds:
            row["per_round"] = row["cpu"] / rounds
            row["ratio"] = row["per_round"] / row["necessary"]
            row["ratio_with_bytes"] = row["per_round"] / (row["necessary"] + row["moved"])
    return row


def _child(conn, name, method, time_limit, profile, options):
    try:
        conn.send(run_one(name, method, time_limit, profile, options))
    except BaseException as exc:  # noqa: BLE001 - reported, never hidden
        conn.send(
            {
                "case": name,
                "method": method,
                "status": f"error: {exc!r}"[:200],
                "traceback": traceback.format_exc()[-800:],
            }
        )
    conn.close()


def median_run(runs: list[dict]) -> dict:
    """The run of median ``ratio_with_bytes`` among ``runs`` (rows of one case and method;
    the lower middle one of an even count), with every run's ratio, sorted, as
    ``ratio_with_bytes_runs``; a run without a ratio (not converged, killed) is the row
    when any run has none: a repeat never hides a failure.

    Examples
    --------
    >>> rows = [{"ratio_with_bytes": r, "cpu": c} for r, c in ((4.2, 1), (3.9, 2), (4.6, 3))]
    >>> row = median_run(rows)
    >>> row["cpu"], row["ratio_with_bytes_runs"]
    (1, [3.9, 4.2, 4.6])
    """
    failed = [r for r in runs if r.get("ratio_with_bytes") is None]
    if failed:
        return failed[0]
    ordered = sorted(runs, key=lambda r: r["ratio_with_bytes"])
    row = dict(ordered[(len(ordered) - 1) // 2])
    row["ratio_with_bytes_runs"] = [r["ratio_with_bytes"] for r in ordered]
    return row


def run_isolated(
    name: str, method: str, time_limit: float, profile: bool = False, options: dict | None = None
) -> dict:
    """:func:`run_one` in a forked child, killed after three times ``time_limit`` (plus the
    model's build)."""
    hard = 3 * time_limit + 120
    row, elapsed, exitcode = run_forked(_child, (name, method, time_limit, profile, options), hard)
    if row is None:
        why = f"killed after {hard:g} s" if elapsed >= hard else f"died ({exitcode})"
        row = {"case": name, "method": method, "status": why, "wall": elapsed}
    row["load1"] = os.getloadavg()[0]
    return row


# ----------------------------------------------------------------------------------------
# Results
# ----------------------------------------------------------------------------------------
def _judge(rows: list[dict]) -> None:
    """Gap and violation of every fedmodel row against its case's Clarabel row."""
    ref = {r["case"]: r for r in rows if r["method"] == "clarabel"}
    cases = {}
    for r in rows:
        f_star = ref.get(r["case"], {}).get("f_star", np.nan)
        if r["method"] == "clarabel" or "solution" not in r or not np.isfinite(f_star):
            continue
        case = cases.get(r["case"]) or build(r["case"], federated=False)
        cases[r["case"]] = case
        r.update(judge(case, {"w": np.asarray(r["solution"])}, f_star))


def _source() -> dict:
    """The commit of the fedmodel that ran, and its checkout named by its branch (never
    by its path on this machine)."""
    here = Path(fm.__file__).resolve().parent.parent

    def git(*args: str) -> str:
        try:
            out = subprocess.run(["git", "-C", str(here), *args], capture_output=True, text=True)
        except OSError:
            return "?"
        return out.stdout.strip() or "?"

    commit = git("rev-parse", "--short", "HEAD")
    if git("status", "--porcelain", "--", "fedmodel") not in ("", "?"):
        commit += "+uncommitted"  # (the package differed from the commit)
    return {
        "fedmodel": f"checkout of branch {git('rev-parse', '--abbrev-ref', 'HEAD')}",
        "commit": commit,
    }


def _load() -> list[dict]:
    return json.loads(JSON.read_text()) if JSON.exists() else []


def _times(x) -> str:
    """A ratio as ``4.8x``; ``-`` when the row has none."""
    shown = _fmt(x, ".1f")
    return shown if shown == "-" else shown + "x"


def _fmt(x, spec=".3g") -> str:
    if x is None or (isinstance(x, float) and not np.isfinite(x)):
        return "-"
    return format(x, spec)


def _spread(row: dict) -> str:
    """`` (3.9-4.6, 3 runs)``: the range of a repeated row's ratios; "" for one run."""
    runs = row.get("ratio_with_bytes_runs") or []
    if len(runs) < 2:
        return ""
    return f" ({_fmt(runs[0], '.1f')}-{_fmt(runs[-1], '.1f')}, {len(runs)} runs)"


def _order(row: dict) -> tuple:
    name = row["case"]
    return (FULL.index(name) if name in FULL else 99, name, row.get("label", ""))


def _participation_lines(rows: list[dict]) -> list[str]:
    """The table of the prox-al rows run with ``participation`` (``--options``): the clients
    of a sampled round, the rounds (all of them, and the sampled ones), the client steps
    over the clients (the epochs: a full round is one), next to the same case's row at full
    participation with the same label prefix."""
    sampled = [r for r in rows if r["method"] == "prox-al" and r.get("participation")]
    if not sampled:
        return []
    lines = [
        "",
        "## Partial participation",
        "",
        "prox-al with `participation` (`--options`): each exact-admm round goes to a random "
        "sample of",
        "the clients; the `start`/`outer` rounds and the certificate reach every client. "
        "`epochs`: the",
        "client steps of the sampled rounds over the clients (a full round is one).",
        "",
        "| case | label | clients a round | status | rounds | sampled rounds | epochs | gap "
        "| viol | wall s | cpu s | load |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in sampled:
        info = r["participation"]
        epochs = info["client_steps"] / max(1, info["clients"])
        lines.append(
            f"| {r['case']} | {r.get('label', '')} | {info['clients_per_round']} of "
            f"{info['clients']} | {r.get('status', '-')} | {r.get('rounds', '-')} "
            f"| {info['sampled_rounds']} | {epochs:.1f} | {_fmt(r.get('rel_gap'), '.1e')} "
            f"| {_fmt(r.get('rel_violation'), '.1e')} | {_fmt(r.get('wall'))} "
            f"| {_fmt(r.get('cpu'))} | {_fmt(r.get('load1'), '.1f')} |"
        )
    return lines


def write_report(rows: list[dict]) -> None:
    rows = sorted(rows, key=_order)
    by = {}
    for r in rows:
        by.setdefault((r["case"], r.get("label", "")), {})[r["method"]] = r
    lines = [
        "# Scaling: clients and dimension",
        "",
        "Written by `benchmarks/scaling.py` from `benchmarks/results_scaling.json` (see the",
        "script's docstring for the cases and what each column measures). `label` names the",
        "checkout that ran the row (`before`: the base it was compared with). Serial runtime,",
        "prox-al at its defaults (a row run with options names them after its label); every",
        "(case, method) in its own child process.",
        "",
        "| case | label | n | d | status | inner solver | rounds (outer) | gap | viol | compile s | setup s (share) "
        "| wall s | cpu s | per round s | necessary s | moved s | ratio | ratio with bytes "
        "| B/client-round | peak MB "
        "| centralized s | clarabel s | load |",
        "|---|---|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for (name, label), methods in by.items():
        p = methods.get("prox-al", {})
        c = methods.get("centralized", {})
        k = methods.get("clarabel", {})
        if not p:
            continue
        cent = (
            f"{_fmt(c.get('wall'))}, cpu {_fmt(c.get('cpu'))} ({c.get('status', '-')})"
            if c
            else "-"
        )
        clar = f"{_fmt(k.get('wall'))} ({k.get('status', '-')})" if k else "-"
        # (a row run with options says which: the header's "at its defaults" is not its own)
        shown = label + "".join(
            f", {key}={value}" for key, value in sorted((p.get("settings") or {}).items())
        )
        lines.append(
            f"| {name} | {shown} | {p.get('n', '-')} | {p.get('d', '-')} "
            f"| {p.get('status', '-')} | {p.get('inner_solver', '-')} "
            f"| {p.get('rounds', '-')} ({p.get('outer', '-')}) | {_fmt(p.get('rel_gap'), '.1e')} "
            f"| {_fmt(p.get('rel_violation'), '.1e')} | {_fmt(p.get('compile'))} "
            f"| {_fmt(p.get('setup'))} ({_fmt(p.get('setup', np.nan) / p.get('wall', np.nan), '.0%')}) "
            f"| {_fmt(p.get('wall'))} | {_fmt(p.get('cpu'))} | {_fmt(p.get('per_round'))} "
            f"| {_fmt(p.get('necessary'), '.2e')} | {_fmt(p.get('moved'), '.2e')} "
            f"| {_fmt(p.get('ratio'), '.1f')} | {_fmt(p.get('ratio_with_bytes'), '.1f')}{_spread(p)} "
            f"| {_fmt(p.get('bytes_per_client_round'), '.0f')} | {_fmt(p.get('peak_mb'), '.0f')} "
            f"| {cent} | {clar} | {_fmt(p.get('load1'), '.1f')} |"
        )
    lines += _participation_lines(rows)
    profiles = [r for r in rows if r.get("profile")]
    for r in profiles:
        lines += [
            "",
            f"## Profile: {r['case']} ({r.get('label', '')}), prox-al, {r.get('rounds')} rounds "
            f"in {_fmt(r.get('wall'))} s",
            "",
            "```",
            *r["profile"],
            "```",
        ]
    commands = sorted({r.get("command", "") for r in rows if r.get("command")})
    sources = sorted({json.dumps(r.get("source", {}), sort_keys=True) for r in rows})
    lines += ["", "## Commands", "", *[f"    {c}" for c in commands], ""]
    lines += ["Checkouts: " + "; ".join(sources), ""]
    lines += [f"Machine: {platform.machine()}, {os.cpu_count()} cores, python {sys.version[:6]}"]
    MD.write_text("\n".join(lines) + "\n")


#: docs/performance.md's scaling table: the rows labelled ``main`` of the results file,
#: written between these markers by every run (tests/test_benchmark_scaling_docs.py)
DOCS = HERE.parent / "docs" / "performance.md"
DOCS_BEGIN = "<!-- benchmarks/scaling.py writes the table below: do not edit it by hand -->"
DOCS_END = "<!-- end of benchmarks/scaling.py's table -->"


def docs_block(rows: list[dict]) -> str:
    """The table of docs/performance.md: each case's ``main`` row (prox-al at its
    defaults) with its references from the same run (which commit ran it: the results
    file)."""
    by: dict[str, dict[str, dict]] = {}
    for r in sorted(rows, key=_order):
        if r.get("label") == "main":
            by.setdefault(r["case"], {})[r["method"]] = r
    lines = [
        "| case | clients | d | prox-al | rounds | wall s | centralized s | Clarabel s "
        "| s per round | over the arithmetic | over arithmetic and bytes | set-up | peak MB |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, methods in by.items():
        p = methods.get("prox-al")
        if p is None:
            continue
        c, k = methods.get("centralized", {}), methods.get("clarabel", {})
        setup = p.get("setup", np.nan) / p.get("wall", np.nan)
        lines.append(
            f"| {name} | {p.get('n', '-')} | {p.get('d', '-')} | {p.get('status', '-')} "
            f"| {p.get('rounds', '-')} | {_fmt(p.get('wall'))} | {_fmt(c.get('wall'))} "
            f"| {_fmt(k.get('wall'))} | {_fmt(p.get('per_round'))} "
            f"| {_times(p.get('ratio'))} | {_times(p.get('ratio_with_bytes'))}{_spread(p)} "
            f"| {_fmt(setup, '.0%')} "
            f"| {_fmt(p.get('peak_mb'), '.0f')} |"
        )
    return "\n".join(lines)


#: docs/performance.md's participation table, written between these markers
PARTICIPATION_BEGIN = (
    "<!-- benchmarks/scaling.py writes the participation table below: do not edit it by hand -->"
)
PARTICIPATION_END = "<!-- end of benchmarks/scaling.py's participation table -->"
#: the label of the full-participation rows run beside the sampled ones
FULL_PARTICIPATION = "participation full, same session"


def participation_block(rows: list[dict]) -> str:
    """The participation table of docs/performance.md: each prox-al row run with
    ``participation`` next to the same case's row at full participation run beside it
    (label :data:`FULL_PARTICIPATION`)."""
    full = {
        r["case"]: r
        for r in rows
        if r["method"] == "prox-al" and r.get("label") == FULL_PARTICIPATION
    }
    lines = [
        "| case | clients a round | rounds, sampled | client steps (epochs) | gap "
        "| rounds, every client | gap, every client |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in sorted(rows, key=_order):
        info = r.get("participation") if r["method"] == "prox-al" else None
        if not info:
            continue
        f = full.get(r["case"], {})
        epochs = info["client_steps"] / max(1, info["clients"])
        lines.append(
            f"| {r['case']} | {info['clients_per_round']} of {info['clients']} "
            f"| {r.get('rounds', '-')}, {r.get('status', '-')} | {epochs:.0f} "
            f"| {_fmt(r.get('rel_gap'), '.1e')} | {f.get('rounds', '-')}, {f.get('status', '-')} "
            f"| {_fmt(f.get('rel_gap'), '.1e')} |"
        )
    return "\n".join(lines)


def write_docs(rows: list[dict], path: Path = DOCS) -> None:
    """Replace the blocks between :data:`DOCS_BEGIN` and :data:`DOCS_END` and between
    :data:`PARTICIPATION_BEGIN` and :data:`PARTICIPATION_END` of ``path``."""
    page = path.read_text()
    for begin, end, block in (
        (DOCS_BEGIN, DOCS_END, docs_block(rows)),
        (PARTICIPATION_BEGIN, PARTICIPATION_END, participation_block(rows)),
    ):
        start = page.index(begin) + len(begin)
        page = page[:start] + "\n\n" + block + "\n\n" + page[page.index(end) :]
    path.write_text(page)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the small cases only")
    ap.add_argument("--cases", help="comma-separated case names (default: all, or --quick's)")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--time-limit", type=float, default=120.0, help="per solve, seconds")
    ap.add_argument("--label", default="", help="names the checkout in the results")
    ap.add_argument("--profile", help="a case whose prox-al solve runs under cProfile")
    ap.add_argument("--options", default="{}", help="prox-al options, a JSON object")
    ap.add_argument(
        "--repeats", type=int, default=1, help="prox-al runs per case (the median one is kept)"
    )
    args = ap.parse_args(argv)
    names = args.cases.split(",") if args.cases else (QUICK if args.quick else FULL)
    methods = args.methods.split(",")
    if args.profile:
        names, methods = [args.profile], ["prox-al"]
    command = "python benchmarks/scaling.py " + " ".join(argv or sys.argv[1:])
    source = _source()
    new = []
    for name in names:
        for method in methods:
            opts = json.loads(args.options)
            runs = args.repeats if method == "prox-al" and not args.profile else 1
            row = median_run(
                [
                    run_isolated(name, method, args.time_limit, bool(args.profile), opts)
                    for _ in range(runs)
                ]
            )
            row["options"] = opts
            row.update(label=args.label, command=command, source=source)
            if args.profile:
                row["method"] = "prox-al profile"
            new.append(row)
            print(
                f"{name:22s} {method:12s} {row.get('status', '?'):16s} "
                f"rounds {row.get('rounds', '-')!s:5s} wall {_fmt(row.get('wall'))} s "
                f"compile {_fmt(row.get('compile'))} per-round {_fmt(row.get('per_round'))} "
                f"ratio {_fmt(row.get('ratio'), '.1f')} "
                f"(with bytes {_fmt(row.get('ratio_with_bytes'), '.1f')}) peak {_fmt(row.get('peak_mb'), '.0f')} MB",
                flush=True,
            )
    keys = {(r["case"], r["method"], r["label"]) for r in new}
    rows = [r for r in _load() if (r["case"], r["method"], r.get("label", "")) not in keys]
    rows += new
    _judge(rows)
    JSON.write_text(json.dumps(rows, indent=1, default=float) + "\n")
    write_report(rows)
    write_docs(rows)
    if args.profile:
        print("\n".join(new[0].get("profile", [])[:40]))


if __name__ == "__main__":
    main()
