"""How large and how tight the contract running bounds are (docs/harness.md, "Non-vacuity").

``python -m analysis.studies.contract_tightness [--D 128] [--iters 30] [--systems 32]`` prints, per
problem family and contract, ``bound / ||x||`` and ``measured / bound`` for the plain-torch
emulation of the contract (``kernels.emulate``) on bf16 inputs, where *measured* is the
emulation's distance to the exact (float64) run of the same algorithm, result kept in float32,
and ``applied / ||x||``, the whole bound the harness holds a kernel returning x in bf16 to
(the strategy's scales, which add the float32 reference's bound and, for the ridge form, the
kernel's own rounding of ``||H||_F``, plus the bf16 result's rounding where the contract does not
already store x in bf16):

* ``gka_ridge``: GKA's ridge form at a = 0.02 (kappa <= 51), H with spectrum log-uniform in
  [1e-4, 1] times a scale, unit q (``analysis.testing.harness.gka_ridge_case``);
* ``spd``: Chebyshev on SPD H with spectrum log-uniform in [1/51, 1], both ends attained, and
  L, mu the ends (``analysis.testing.harness.spd_case``): the worst case for the bound, which grows
  with the responses at the ends of [mu, L].

For ``bfloat16/storage`` it also prints how much of the bound error sequences allowed by the
rounding model attain (every store off by a full half spacing, any sign: the room any rigorous
bound under that model has left): :func:`adversarial_storage_run` signs them along the bottom
eigenvector, :func:`strongest_storage_run` searches the signs (alternating maximisation); and
what the store errors would cost combined componentwise in A's eigenbasis instead of by norms
(:func:`eigenbasis_store_bound`); and the bound in trajectory mode, each store bounded at the
emulation's own iterate (its i-step runs, ``linear_bound(..., observed=)``), with the largest
deviation/bound of any step. For ``bfloat16/operands`` it prints the same search over
operand roundings (:func:`strongest_operand_run`). Last, for a power-of-two D, the same
for :func:`binade_ridge_system`, a ridge system of GKA's form built for the stores' worst case.
"""

from __future__ import annotations

import torch

from analysis.argtypes import HelpFormatter, OneLineParser, non_negative_int, positive_int
from analysis.bounds.contract import _schedule, linear_bound

CONTRACTS = ("float32", "tf32", "bfloat16/operands", "bfloat16/storage")


def _problem(family: str, D: int, n: int, iters: int, seed: int):
    from analysis.testing import harness

    if family == "gka_ridge":
        c = harness.gka_ridge_case(D, (n,), a=0.02, iters=iters, kappa_h=1e4, seed=seed)
        H, q = (c.inputs[k].to(torch.bfloat16).double() for k in ("H", "q"))
        fro = torch.linalg.matrix_norm(H)
        lam = 0.02 * fro
        return H, q, dict(L=fro + lam, mu=lam, shift=lam), dict(a=0.02)
    c = harness.spd_case(D, (n,), 51.0, iters=iters, seed=seed)
    H, q = (c.inputs[k].to(torch.bfloat16).double() for k in ("H", "q"))
    return (
        H,
        q,
        dict(L=c.options["L"], mu=c.options["mu"]),
        dict(L=c.options["L"], mu=c.options["mu"]),
    )


def tightness(
    family: str,
    contract: str,
    *,
    D: int = 128,
    iters: int = 30,
    systems: int = 32,
    seed: int = 0,
    flips: int = 0,
) -> dict:
    """Quantiles of ``bound/||x||`` and ``measured/bound`` over ``systems`` systems."""
    from kernels import emulate

    H, q, bound_kw, call_kw = _problem(family, D, systems, iters, seed)
    run = linear_bound("chebyshev", H, q, iters=iters, contract=contract, **bound_kw)
    fn = emulate.gka_ridge if family == "gka_ridge" else emulate.chebyshev
    x = fn(H.float(), q.float(), iters=iters, contract=contract, **call_kw).double()
    measured = (x - run.x[-1]).norm(dim=-1) / run.bound[-1]
    rel = run.relative

    def q_(t):
        return {
            k: float(t.quantile(p))
            for k, p in (("min", 0.0), ("median", 0.5), ("p90", 0.9), ("max", 1.0))
        }

    out = {
        "bound_over_x": q_(rel),
        "measured_over_bound": q_(measured),
        "applied_over_x": q_(
            _applied(family, H, q, iters, seed, contract, x) / run.x[-1].norm(dim=-1)
        ),
    }
    if contract == "bfloat16/operands":
        worst = _operand_diagnostics(H, q, bound_kw, iters, run)
        out["strongest_over_bound"] = q_(worst)
        out["strongest_over_x"] = q_(worst * rel)
    if contract == "bfloat16/storage":
        aligned, strongest, eig = _storage_diagnostics(H, q, bound_kw, iters, run, flips)
        out["adversarial_over_bound"] = q_(aligned)
        out["strongest_over_bound"] = q_(strongest)
        out["strongest_over_x"] = q_(strongest * rel)
        out["eigenbasis_over_normwise"] = q_(eig)
        out["drift_free_over_x"] = q_(
            linear_bound(
                "chebyshev", H, q, iters=iters, contract=contract, store_drift=False, **bound_kw
            ).relative
        )
        # trajectory mode: the emulation's own iterates (its i-step runs), stores bounded there
        obs = torch.stack(
            [fn(H.float(), q.float(), iters=i, contract=contract, **call_kw) for i in range(iters)]
            + [x.float()]
        )
        seen = linear_bound(
            "chebyshev", H, q, iters=iters, contract=contract, observed=obs, **bound_kw
        )
        out["observed_over_x"] = q_(seen.relative)
        out["observed_measured_over_bound"] = q_((x - seen.x[-1]).norm(dim=-1) / seen.bound[-1])
        out["observed_departure"] = q_(seen.departed.amax(0))
        # the step-r check of trajectory mode: the kernel's run against the exact one, with the
        # ridge form's own ||H||_F error (harness._ridge_scales) and nothing of the reference's
        held = seen
        if family == "gka_ridge":
            from analysis.bounds.contract import fro_error

            rel = fro_error(H.shape[-1], contract)
            held = linear_bound(
                "chebyshev",
                H,
                q,
                iters=iters,
                contract=contract,
                observed=obs,
                shift_error=bound_kw["shift"] * rel,
                param_rel_error=rel,
                **bound_kw,
            )
        out["observed_held_over_x"] = q_(held.relative)
        out["observed_applied_over_x"] = q_(
            _applied(family, H, q, iters, seed, contract, x, observed=obs) / seen.x[-1].norm(dim=-1)
        )
    return out


def _applied(
    family: str, H, q, iters: int, seed: int, contract: str, x, observed=None
) -> torch.Tensor:
    """The bound the harness applies to a kernel returning x in bf16 (per system): the
    strategy's scales (the contract's running bound, with ``||H||_F``'s own rounding for the
    ridge form, plus the float32 reference's) and the rounding of the bf16 output where the
    contract's bound does not already store it (``analysis.testing.harness.run_case``)."""
    from analysis.testing import harness
    from solvers.contracts import parse

    n, D = q.shape
    if family == "gka_ridge":
        case = harness.gka_ridge_case(D, (n,), a=0.02, iters=iters, kappa_h=1e4, seed=seed)
        scales, strategy = harness._ridge_scales, harness.gka_ridge
    else:
        case = harness.spd_case(D, (n,), 51.0, iters=iters, seed=seed)
        scales, strategy = harness._solve_scales, harness.spd
    extra = {} if observed is None else {"observed": observed}
    bound = scales(case, {"H": H, "q": q}, parse(contract), **extra)[0]
    stored = strategy(max_d=D).stored_outputs(parse(contract))[0]
    if harness._rounded_in_bound(stored, torch.bfloat16):
        return bound
    return bound + harness.output_rounding_bound(x.to(torch.bfloat16), (-1,))


def _systems(H, q, bound_kw):
    """Per system: (A = H + shift I, L, mu) as float64 / floats."""
    n, D = q.shape
    shift, L, mu = (
        torch.broadcast_to(torch.as_tensor(bound_kw.get(k, 0.0), dtype=torch.float64), (n,))
        for k in ("shift", "L", "mu")
    )
    for s in range(n):
        yield H[s] + shift[s] * torch.eye(D, dtype=torch.float64), float(L[s]), float(mu[s])


def _storage_diagnostics(H, q, bound_kw, iters: int, run, flips: int = 0):
    """Per system: :func:`adversarial_storage_run`'s and :func:`strongest_storage_run`'s errors over
    the bound, and :func:`eigenbasis_store_bound`'s ratio."""
    aligned, strongest, eig = [], [], []
    for s, (A, L, mu) in enumerate(_systems(H, q, bound_kw)):
        v = torch.linalg.eigh(A).eigenvectors[:, 0]
        x, exact = adversarial_storage_run(A, q[s], L=L, mu=mu, iters=iters, v=v)
        aligned.append(torch.linalg.vector_norm(x - exact) / run.bound[-1, s])
        x, exact = strongest_storage_run(A, q[s], L=L, mu=mu, iters=iters, flips=flips)
        strongest.append(torch.linalg.vector_norm(x - exact) / run.bound[-1, s])
        comp, norm = eigenbasis_store_bound(A, run.x[:, s], L=L, mu=mu, iters=iters)
        eig.append(comp / norm)
    return torch.stack(aligned), torch.stack(strongest), torch.stack(eig)


def _operand_diagnostics(H, q, bound_kw, iters: int, run):
    """Per system: :func:`strongest_operand_run`'s error over the bound."""
    out = []
    for s, (A, L, mu) in enumerate(_systems(H, q, bound_kw)):
        x, exact = strongest_operand_run(A, q[s], L=L, mu=mu, iters=iters)
        out.append(torch.linalg.vector_norm(x - exact) / run.bound[-1, s])
    return torch.stack(out)


def binade_ridge_system(
    D: int = 128, *, a: float = 0.02, q_scale: float = 231 / 256, column: int = 5
):
    """A ridge system of GKA's form (``lambda = a ||H||_F``, eq. (4)) built for the stores' worst
    case: ``H = I - w w^T / D`` with w a column of the +-1 Sylvester-Hadamard matrix (D a power of
    two), so H is PSD with eigenvalues 0 (along w) and 1, every entry exact in bf16, and A's
    bottom eigenvalue sits at mu = lambda, where a stored iterate's responses peak
    (``1/(1 - R)^2`` summed). ``q = q_scale w`` (exact in bf16) puts the solution along w, every
    component of equal size, and q_scale = 231/256 puts them just above a power of two (4.0022),
    where a bf16 spacing is largest relative to the value. Returns (H, q) in float64, both exact
    bf16 values; the Chebyshev interval is ``[lambda, ||H||_F + lambda]``, kappa = 51 at a = 0.02."""
    if D < 1 or D & (D - 1):
        raise ValueError(f"D must be a power of two, got {D}")
    had = torch.ones((1, 1), dtype=torch.float64)
    while had.shape[0] < D:
        had = torch.cat([torch.cat([had, had], 1), torch.cat([had, -had], 1)], 0)
    w = had[:, column % D]
    H = torch.eye(D, dtype=torch.float64) - torch.outer(w, w) / D
    return H, q_scale * w


def binade_ridge_worst_case(D: int = 128, *, iters: int = 30, a: float = 0.02) -> dict:
    """On :func:`binade_ridge_system`: the strongest store sequence the rounding model allows
    (:func:`strongest_storage_run`), the ``bfloat16/storage`` bound (and the same without the
    drift in the stores, which is not a bound), and the round-to-nearest
    emulation (``kernels.emulate.gka_ridge``), each over ``||x||``. The searched error is a lower
    bound on what any bound built on that model must cover on this system."""
    from kernels import emulate

    H, q = binade_ridge_system(D, a=a)
    fro = torch.linalg.matrix_norm(H)
    lam = a * fro

    def bound(drift: bool):
        return linear_bound(
            "chebyshev",
            H[None],
            q[None],
            L=(fro + lam)[None],
            mu=lam[None],
            shift=lam[None],
            iters=iters,
            contract="bfloat16/storage",
            store_drift=drift,
        ).bound[-1, 0]

    A = H + lam * torch.eye(D, dtype=torch.float64)
    x, exact = strongest_storage_run(A, q, L=float(fro + lam), mu=float(lam), iters=iters)
    norm = float(torch.linalg.vector_norm(exact))
    rn = emulate.gka_ridge(
        H[None].float(), q[None].float(), a=a, iters=iters, contract="bfloat16/storage"
    ).double()[0]
    return {
        "searched_over_x": float(torch.linalg.vector_norm(x - exact)) / norm,
        "bound_over_x": float(bound(True)) / norm,
        "drift_free_over_x": float(bound(False)) / norm,  # not a bound: stores at h(x) alone
        "emulation_over_x": float(torch.linalg.vector_norm(rn - exact)) / norm,
    }


def _half_spacing(y, u=2.0**-8):
    return u * torch.exp2(torch.floor(torch.log2(y.abs())))


def _responses(L, mu, iters: int, lam):
    """``tau_{r,j}(lam)`` for j = 0..r, ``(r+1, *lam.shape)``: how a unit error stored in x_j
    reaches Chebyshev's x_r on eigenvalue lam."""
    c, b, _, _, _ = _schedule("chebyshev", L, mu, iters, ())
    lam = torch.as_tensor(lam, dtype=torch.float64)
    tau = torch.zeros((iters + 1, *lam.shape), dtype=torch.float64)
    for j in range(iters + 1):
        cur, old = torch.ones_like(lam), torch.zeros_like(lam)
        for i in range(j + 1, iters + 1):
            cur, old = (1 - c[i - 1] * lam) * cur + b[i - 1] * (cur - old), cur
        tau[j] = cur
    return tau


def eigenbasis_store_bound(A, xs, *, L, mu, iters: int):
    """Two combinations of store errors ``|e_j| <= h(x_j)`` (componentwise, no drift) through
    Chebyshev's responses: componentwise in A's eigenbasis, ``|| sum_j |tau_{r,j}(lam_k)|
    (|V|^T h_j)_k ||_2`` over k, and by norms, ``sum_j max_k |tau_{r,j}(lam_k)| ||h_j||``.
    xs: ``(r+1, D)`` the exact iterates. Both are rigorous for these errors. At one eigenvector
    the first is smaller (``sum_i |v_i| h_i <= ||h||``), but summed over the eigenvalues where the
    responses are large it is several times the second: each collects the absolute entries of
    its eigenvector."""
    lam, V = torch.linalg.eigh(A)
    tau = _responses(L, mu, iters, lam).abs()
    h = _half_spacing(xs)
    comp = torch.linalg.vector_norm((tau * (h @ V.abs())).sum(0))
    norm = (tau.amax(-1) * torch.linalg.vector_norm(h, dim=-1)).sum()
    return comp, norm


def strongest_storage_run(A, q, *, L, mu, iters: int, rounds: int = 10, flips: int = 0):
    """The largest final error found among store sequences allowed by the rounding model (every
    store off by a full half spacing of bf16, any signs): alternating maximisation, started from
    the direction of the solution (where a stored iterate's errors gather). For a direction w the
    signs ``sign(tau_{r,j}(A) w)`` maximise ``w^T (x_r - x_r*)`` to first order; w then moves to
    the error found. ``flips`` > 0 then runs that many sweeps of greedy single-sign flips judged
    on the whole perturbed run (:func:`flip_search`), which sees what the first-order choice does
    not: a store that pushes later values over a power of two, where their spacing doubles.
    Returns (the perturbed x_r, the exact x_r) of the best sequence."""
    best, signs = _strongest(A, q, L=L, mu=mu, iters=iters, rounds=rounds, operand=False)
    if flips <= 0:
        return best
    signs = flip_search(A, q, L=L, mu=mu, iters=iters, signs=signs, sweeps=flips)
    return adversarial_storage_run(A, q, L=L, mu=mu, iters=iters, signs=signs)


def flip_search(A, q, *, L, mu, iters: int, signs, sweeps: int, tries: int = 8):
    """Greedy coordinate ascent on the signs ``(r+1, D)`` of :func:`adversarial_storage_run`: per
    sweep and step j, all D single flips of step j are run at once, and the ``tries`` best are
    taken one by one while the final error grows. Returns the signs (never a weaker sequence)."""
    D = q.shape[-1]
    signs = signs.clone()

    def error(batch):  # (B, r+1, D) signs -> (B,) final errors
        x, exact = adversarial_storage_run(A, q, L=L, mu=mu, iters=iters, signs=batch)
        return torch.linalg.vector_norm(x - exact, dim=-1)

    best = error(signs[None])[0]
    eye = torch.arange(D)
    for _ in range(sweeps):
        grew = False
        for j in range(iters + 1):
            cand = signs.expand(D, -1, -1).clone()
            cand[eye, j, eye] *= -1
            for k in torch.argsort(error(cand), descending=True)[:tries]:
                trial = signs.clone()
                trial[j, k] *= -1
                val = error(trial[None])[0]
                if val <= best:
                    break
                signs, best, grew = trial, val, True
        if not grew:
            break
    return signs


def strongest_operand_run(A, q, *, L, mu, iters: int, rounds: int = 10):
    """As :func:`strongest_storage_run` for ``bfloat16/operands``: the iterate is exact (float64
    here) but the operand of every product ``A x_{j-1}`` is off by a full half spacing of bf16 at
    ``x_{j-1}``, any signs. Such an error reaches x_r through ``-c_j tau_{r,j}(A) A``, so near
    L (where ``c_j lam`` is about 2 omega_j) it is amplified where a stored iterate's is not:
    the worst case of ``spd`` at kappa = 51 (docs/harness.md, "Non-vacuity")."""
    return _strongest(A, q, L=L, mu=mu, iters=iters, rounds=rounds, operand=True)[0]


def _strongest(A, q, *, L, mu, iters: int, rounds: int, operand: bool):
    lam, V = torch.linalg.eigh(A)
    tau = _responses(L, mu, iters, lam)  # row j: a unit error in x_j, on each eigenvalue
    if operand:  # the operand of step j (j = 1..r) rounds x_{j-1}; its error enters x_j as -c_j A e
        c, _, _, _, _ = _schedule("chebyshev", L, mu, iters, ())
        tau = -c.unsqueeze(-1) * tau[1:] * lam
    run = adversarial_operand_run if operand else adversarial_storage_run
    w = torch.linalg.solve(A, q)
    best = best_signs = None
    for _ in range(rounds):
        w = w / torch.linalg.vector_norm(w)
        signs = torch.sign((tau * (V.T @ w)) @ V.T)  # row j: sign(response_j(A) w)
        x, exact = run(A, q, L=L, mu=mu, iters=iters, signs=signs)
        w = x - exact
        if best is None or torch.linalg.vector_norm(w) > torch.linalg.vector_norm(
            best[0] - best[1]
        ):
            best, best_signs = (x, exact), signs
    return best, best_signs


def adversarial_operand_run(A, q, *, L, mu, iters: int, signs, scale: float = 1.0):
    """Chebyshev on ``A x = q`` (one system, float64) in exact arithmetic but for the operand of
    each product ``A x_{i}``, off by ``scale`` times a full half spacing of bf16 at the value
    rounded (allowed by ``bfloat16/operands``' rounding model for ``scale <= 1``), with the signs
    ``signs[i]`` (``(r, D)``). Returns (the perturbed x_r, the exact x_r): a lower bound on the
    worst case any rigorous bound under that contract's rounding model must cover."""
    return _perturbed_run(
        A, q, L=L, mu=mu, iters=iters, operand=lambda x, i: x + scale * signs[i] * _half_spacing(x)
    )


def adversarial_storage_run(A, q, *, L, mu, iters: int, v=None, signs=None, scale: float = 1.0):
    """Chebyshev on ``A x = q`` (one system, float64) in exact arithmetic but for the stores of the
    iterate, each off by ``scale`` times a full half spacing of bf16 (allowed by the rounding model
    of ``analysis.bounds.contract.store_error_bound`` for ``scale <= 1``), with the signs
    ``signs[..., j, :]`` (``(r+1, D)``, or ``(B, r+1, D)`` for B runs at once) or, given ``v`` (the eigenvector where the responses peak), signed
    along ``v`` with the sign of the response at mu of the final iterate to that step's error.
    Returns (the perturbed x_r, the exact x_r): a lower bound on the worst case that any rigorous
    bound under ``bfloat16/storage`` must cover."""
    if signs is None:
        signs = torch.sign(_responses(L, mu, iters, mu)).unsqueeze(-1) * torch.sign(v)
    return _perturbed_run(
        A,
        q,
        L=L,
        mu=mu,
        iters=iters,
        store=lambda y, j: y + scale * signs[..., j, :] * _half_spacing(y),
    )


def _perturbed_run(A, q, *, L, mu, iters: int, store=None, operand=None):
    """Chebyshev beside its exact run, with ``store(y, j)`` applied to each iterate x_j as it is
    stored and ``operand(x, i)`` to the operand of step i's product: (perturbed x_r, exact x_r)."""
    store = store or (lambda y, j: y)
    operand = operand or (lambda x, i: x)
    c, b, _, s0, _ = _schedule("chebyshev", L, mu, iters, ())
    x, exact = store(s0 * q, 0), s0 * q
    prev = prev_e = torch.zeros_like(q)
    for i in range(iters):
        y = x - c[i] * (operand(x, i) @ A - q) + b[i] * (x - prev)  # A symmetric: x @ A = A x,
        ye = exact - c[i] * (exact @ A - q) + b[i] * (exact - prev_e)  # and rows of x batch
        prev, x = x, store(y, i + 1)
        prev_e, exact = exact, ye
    return x, exact


def main(argv=None) -> int:
    ap = OneLineParser(
        prog="python -m analysis.studies.contract_tightness",
        description=__doc__.splitlines()[0],
        formatter_class=HelpFormatter,
    )
    ap.add_argument("--D", type=positive_int, default=128, help="system size D")
    ap.add_argument(
        "--iters", type=positive_int, default=30, help="Chebyshev iterations r of every run"
    )
    ap.add_argument(
        "--systems",
        type=positive_int,
        default=32,
        help="systems per problem family (the quantiles are over these)",
    )
    ap.add_argument(
        "--flips",
        type=non_negative_int,
        default=0,
        help="sweeps of greedy sign flips after the storage search (strongest_storage_run)",
    )
    args = ap.parse_args(argv)
    print(f"D={args.D} r={args.iters} systems={args.systems} bf16 inputs")
    print(
        f"{'family':10s} {'contract':18s} {'bound/||x|| median (max)':>26s} {'measured/bound median (max)':>29s}"
        f" {'applied/||x|| median (max)':>28s}"
    )
    for fam in ("gka_ridge", "spd"):
        for c in CONTRACTS:
            t = tightness(
                fam, c, D=args.D, iters=args.iters, systems=args.systems, flips=args.flips
            )
            b, m, a = t["bound_over_x"], t["measured_over_bound"], t["applied_over_x"]
            print(
                f"{fam:10s} {c:18s} {b['median']:>17.4f} ({b['max']:.4f}) {m['median']:>20.3f} ({m['max']:.3f})"
                f" {a['median']:>19.4f} ({a['max']:.4f})"
            )
            if c == "bfloat16/operands":
                s, sx = t["strongest_over_bound"], t["strongest_over_x"]
                print(
                    f"{'':29s} adversarial operands / bound: searched {s['median']:.3f} "
                    f"(min {s['min']:.3f}, max {s['max']:.3f}) = {sx['median']:.4f} ({sx['max']:.4f}) of ||x||"
                )
            if "adversarial_over_bound" in t:
                a, s, sx, e = (
                    t[k]
                    for k in (
                        "adversarial_over_bound",
                        "strongest_over_bound",
                        "strongest_over_x",
                        "eigenbasis_over_normwise",
                    )
                )
                print(
                    f"{'':29s} adversarial stores / bound: along v_min {a['median']:.3f} (max {a['max']:.3f}), "
                    f"searched {s['median']:.3f} (min {s['min']:.3f}, max {s['max']:.3f}) = "
                    f"{sx['median']:.4f} ({sx['max']:.4f}) of ||x||"
                )
                print(
                    f"{'':29s} stores combined in the eigenbasis / by norms (no drift): "
                    f"{e['median']:.2f} (min {e['min']:.2f})"
                )
                d = t["drift_free_over_x"]
                print(
                    f"{'':29s} without the drift in the stores (not a bound): {d['median']:.4f} ({d['max']:.4f}) of ||x||"
                )
                o, om, oa, od, oh = (
                    t[k]
                    for k in (
                        "observed_over_x",
                        "observed_measured_over_bound",
                        "observed_applied_over_x",
                        "observed_departure",
                        "observed_held_over_x",
                    )
                )
                print(
                    f"{'':29s} trajectory observed (stores at the kernel's iterates): bound "
                    f"{o['median']:.4f} ({o['max']:.4f}) of ||x||, measured/bound {om['median']:.3f} "
                    f"({om['max']:.3f}); every step's deviation/bound at most {od['max']:.3f}"
                )
                print(
                    f"{'':29s}   applied: {oh['median']:.4f} ({oh['max']:.4f}) against the exact run, "
                    f"{oa['median']:.4f} ({oa['max']:.4f}) against the float32 reference"
                )
    w = binade_ridge_worst_case(args.D, iters=args.iters) if args.D & (args.D - 1) == 0 else None
    if w is not None:
        print(
            f"binade_ridge bfloat16/storage: bound {w['bound_over_x']:.4f} of ||x||, searched stores "
            f"{w['searched_over_x']:.4f} ({w['searched_over_x'] / w['bound_over_x']:.3f} of the bound), "
            f"round-to-nearest emulation {w['emulation_over_x']:.4f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
