"""GKA Fig. 9 (appendix K): Chebyshev on the Fig. 1a problems for ridge strengths
a in {0.01, 0.02, 0.05, 0.1}, the memorisation trade-off.

For each a the problems are ``solvers.fig1a_problems(..., a=a)`` (same keys and queries, so
only lambda = a changes; ``||H||_F = 1``, L = 1 + a, mu = a, kappa <= (1 + a)/a). Measured
against the float64 problem, for the CH iterates xi_i of each working precision:

* the maximum regularised residual ``max ||(H + a I) xi_i - q||`` (the paper's Fig. 9 metric),
  with the exact-arithmetic bound ``1 / T_{i+1}(1/rho)`` (``analysis.bounds.iterative.chebyshev_bound``);
* the true residual ``||H xi_i - q||`` with its floor, the true residual of the exact ridge
  solution ``a ||(H + a I)^{-1} q||``. Its maximum is ~1 for every a (the early tokens' H has
  rank t < D and cannot fit the part of q outside its range), so the plot shows the median.

The paper prints no numbers for Fig. 9; its statements (appendix K) are that the maximum
regularised residual decreases as a grows and that a larger a may enlarge the true residual.
The paper table checks both orderings at i = 30, GKA's iteration count.
"""

from __future__ import annotations

import pathlib

import torch

import solvers
from analysis.bounds import iterative as bounds
from analysis.precision import PRECISIONS, by_label

from . import _common as C
from ._runs import workspace_bytes

NAME = "gka_fig9"
HELP = "GKA Fig. 9: max regularised and true residual of CH vs iteration for a in {0.01, 0.02, 0.05, 0.1}"

QUICK_SCALE = {"B": 1, "T": 64, "heads": 2, "D": 16}
CPU_SCALE = {"B": 2, "T": 256, "heads": 4, "D": 64}
PAPER_SCALE = {"B": 8, "T": 2048, "heads": 8, "D": 128}
RIDGES = (0.01, 0.02, 0.05, 0.1)
GKA_ITERS = 30
TINY = {
    "scale": {"B": 1, "T": 8, "heads": 1, "D": 8},
    "iters": GKA_ITERS + 1,
}  # a seconds-long run for tests/test_figures.py
PLOTTED = ("float32", "bfloat16/storage")


def params_for(quick: bool) -> dict:
    scale = QUICK_SCALE if quick else (PAPER_SCALE if C.on_gpu(quick) else CPU_SCALE)
    return {
        "scale": dict(scale),
        "ridges": list(RIDGES),
        "iters": 50,
        "seed": 0,
        "precisions": [p.label for p in PRECISIONS],
        "device": str(C.device(quick)),
    }


def _residuals(A64, H64, q64, iterates) -> tuple:
    """``||A x_i - q||`` and ``||H x_i - q||`` in float64, each ``(iters + 1, systems)``."""
    reg, true = [], []
    for x in iterates:
        x = x.to(torch.float64).unsqueeze(-1)
        reg.append(torch.linalg.vector_norm((A64 @ x).squeeze(-1) - q64, dim=-1))
        true.append(torch.linalg.vector_norm((H64 @ x).squeeze(-1) - q64, dim=-1))
    return torch.stack(reg), torch.stack(true)


def compute(params: dict) -> dict:
    s = params["scale"]
    dev = torch.device(params["device"])
    D, iters = s["D"], params["iters"]
    chunk = max(1, workspace_bytes(dev) // ((iters + 1) * D * D * 8))
    out = {}
    for a in params["ridges"]:
        P = solvers.fig1a_problems(
            s["B"], s["T"], s["heads"], s["D"], a=a, seed=params["seed"], device=dev
        )
        A64 = P.A.reshape(-1, D, D)
        q64 = P.q.reshape(-1, D)
        H64 = A64 - a * torch.eye(D, dtype=torch.float64, device=dev)
        x_ridge = torch.linalg.solve(A64, q64)
        floor = a * torch.linalg.vector_norm(x_ridge, dim=-1)
        per = {}
        for arith in PRECISIONS:
            if arith.label not in params["precisions"]:
                continue
            parts = []
            for st in range(0, A64.shape[0], chunk):
                sl = slice(st, st + chunk)
                _, info = solvers.chebyshev(
                    A64[sl].to(arith.dtype),
                    q64[sl].to(arith.dtype),
                    L=P.L,
                    mu=P.mu,
                    iters=iters,
                    bf16_mode=arith.mode,
                    return_info=True,
                )
                parts.append(_residuals(A64[sl], H64[sl], q64[sl], info.iterates))
            reg = torch.cat([p[0] for p in parts], dim=1)
            true = torch.cat([p[1] for p in parts], dim=1)
            per[arith.label] = {
                "regularised_max": C.tolist(reg.max(1).values),
                "true_max": C.tolist(true.max(1).values),
                "true_median": C.tolist(true.median(1).values),
            }
        out[str(a)] = {
            "series": per,
            "true_floor_max": float(floor.max()),
            "true_floor_median": float(floor.median()),
            "kappa": P.L / P.mu,
            "bound": C.tolist(bounds.chebyshev_bound(P.L / P.mu, torch.arange(iters + 1))),
        }
    return {"ridges": out}


def paper_rows(data: dict) -> list:
    """The appendix-K orderings at i = 30, the iteration count GKA trains with (appendix F)."""
    i = GKA_ITERS
    ridges = data["ridges"]
    keys = sorted(ridges, key=float)
    rows = []
    for label in ridges[keys[0]]["series"]:
        reg = [ridges[k]["series"][label]["regularised_max"][i] for k in keys]
        dec = all(x >= y for x, y in zip(reg, reg[1:]))
        rows.append(
            C.PaperRow(
                f"max regularised residual decreases with a ({label}, i = {i})",
                "decreases",
                ", ".join(f"{v:.1e}" for v in reg),
                dec,
                f"a = {', '.join(keys)}",
            )
        )
        true = [ridges[k]["series"][label]["true_median"][i] for k in keys]
        inc = all(x <= y for x, y in zip(true, true[1:]))
        rows.append(
            C.PaperRow(
                f"median true residual grows with a ({label}, i = {i})",
                "may grow",
                ", ".join(f"{v:.1e}" for v in true),
                inc,
                "'might enlarge' (appendix K)",
            )
        )
    floors = [ridges[k]["true_floor_median"] for k in keys]
    rows.append(
        C.PaperRow(
            "true-residual floor a ||x_a|| (median over systems)",
            "grows with a",
            ", ".join(f"{v:.2e}" for v in floors),
            all(x <= y for x, y in zip(floors, floors[1:])),
        )
    )
    return rows


def render(out_dir: pathlib.Path, params: dict, data: dict) -> list:
    fig, axes = C.subplots(2, width=5.4)
    its = list(range(params["iters"] + 1))
    colors = dict(
        zip(sorted(data["ridges"], key=float), ["tab:red", "tab:orange", "tab:green", "tab:blue"])
    )
    for key, d in data["ridges"].items():
        col = colors[key]
        for label in PLOTTED:
            if label not in d["series"]:
                continue
            ser = d["series"][label]
            ls = C.PRECISION_STYLES[label]
            axes[0][0].plot(
                its, C.positive(ser["regularised_max"]), color=col, ls=ls, label=f"a={key} {label}"
            )
            axes[0][1].plot(
                its, C.positive(ser["true_median"]), color=col, ls=ls, label=f"a={key} {label}"
            )
        axes[0][0].plot(its, C.positive(d["bound"]), color=col, lw=0.7, ls=(0, (1, 3)))
        axes[0][1].axhline(d["true_floor_median"], color=col, lw=0.8, ls=(0, (1, 3)))
    # the rounding floor of each plotted precision (q has unit norm): below u_store ||q|| the
    # stored q itself is unresolved, so a plateau there is rounding, not a slow iteration. Grey,
    # in the precision's line style, named in the shared legend (a label inside the panel sat
    # on the bf16 plateaus and was crossed by the curves)
    for label in PLOTTED:
        axes[0][0].axhline(
            by_label(label).u_store,
            color="0.45",
            lw=0.9,
            ls=C.PRECISION_STYLES[label],
            zorder=1,
            label=f"rounding floor u_store ||q||, {label}",
        )
    # both panels draw the same eight series: one legend below them, where it covers no data
    # (inside a panel it hid the a = 0.01 and 0.02 curves of the first iterations); it also
    # names the two rounding floors
    C.finish_axis(
        axes[0][0],
        xlabel="iteration i",
        ylabel="max ||(H + a I) xi_i - q||",
        legend=False,
        title="regularised residual (dotted: bound 1/T_{i+1}(1/rho))",
    )
    C.finish_axis(
        axes[0][1],
        xlabel="iteration i",
        ylabel="median ||H xi_i - q||",
        legend=False,
        title="true residual (dotted: median floor a ||x_a||, exact ridge solution)",
    )
    s = params["scale"]
    files = C.save_figure(
        fig,
        out_dir,
        NAME,
        f"GKA Fig. 9: B={s['B']}, T={s['T']}, heads={s['heads']}, D={s['D']}",
        legend_from=axes[0][0],
        legend_cols=5,
    )
    rows = []
    for key, d in data["ridges"].items():
        for label, ser in d["series"].items():
            for i in its:
                rows.append(
                    {
                        "a": float(key),
                        "precision": label,
                        "iteration": i,
                        "regularised_max": ser["regularised_max"][i],
                        "true_max": ser["true_max"][i],
                        "true_median": ser["true_median"][i],
                        "bound": d["bound"][i],
                        "true_floor_max": d["true_floor_max"],
                        "true_floor_median": d["true_floor_median"],
                    }
                )
    files += C.write_data(out_dir, NAME, rows, {"params": params}, paper_rows(data))
    return files


run = C.figure_runner(__name__)
