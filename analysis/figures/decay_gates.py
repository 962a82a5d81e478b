"""Decay gates (gate reparameterisation proposal): gate value vs gradient and gradient scales for
the sigmoid, the gradient-balanced phi(z) = max(0, 1 - 1/(a z^2 + b)) (a = b = 1) and the
"softplus" form 1 - exp(-softplus(z)), all from ``solvers.gates``.

Panels: (a) phi(z); (b) phi'(z) against the gate value (long memory = gate near 1, plotted
against -log10(1 - phi)); (c) the gradient-over-weight ratio |phi'|/phi^2 the proposal tabulates,
next to its printed form 2a|z| for the balanced gate, and StableSSM's |phi'|/(1 - phi)^2;
(d) precision: the relative error of the gate value as each precision computes it (float64
reference), for the stable forms and for the softplus form as printed (1 - exp(-softplus z)),
whose subtraction cancels for gates near 0.

Paper values ("Effect on optimization"): sigmoid at alpha = 0.99 (z ~ 4.6) has sigma' ~ 0.01,
"100x smaller" than sigma'(0) = 0.25; the balanced gate at alpha = 0.99 (z ~ 10) has
phi'(10) ~ 0.002 and phi'(1) = 0.5 at alpha = 0.5, a ratio of "250x"; and |phi'|/phi^2 = 2|z|.
"""

from __future__ import annotations

import math
import pathlib

import torch

from analysis.precision import PRECISIONS
from solvers.gates import (
    GATES,
    gradient_over_weight,
    printed_balanced_gradient_scale,
    stable_gradient_scale,
)

from . import _common as C

NAME = "decay_gates"
HELP = "Decay gates: value vs gradient and gradient scales of sigmoid, balanced phi, softplus; precision"
TINY = {"points": 41}  # a seconds-long run for tests/test_figures.py

F64 = torch.float64
COLORS = {"sigmoid": "tab:blue", "balanced": "tab:red", "softplus": "tab:green"}


def params_for(quick: bool) -> dict:
    return {"z_min": -30.0, "z_max": 30.0, "points": 601 if quick else 4001}


def _f(t: torch.Tensor) -> list:
    return C.tolist(t)


def paper_numbers() -> dict:
    """The proposal's worked example, evaluated in float64 with ``solvers.gates``."""
    sig, bal = GATES["sigmoid"], GATES["balanced"]
    z = torch.tensor([0.0, 4.6, 1.0, 10.0], dtype=F64)
    ds, db = sig.derivative(z), bal.derivative(z)
    vs, vb = sig.value(z), bal.value(z)
    return {
        "sigma(4.6)": float(vs[1]),
        "sigma'(4.6)": float(ds[1]),
        "sigma'(0)": float(ds[0]),
        "sigmoid ratio": float(ds[0] / ds[1]),
        "phi(10)": float(vb[3]),
        "phi'(10)": float(db[3]),
        "phi(1)": float(vb[2]),
        "phi'(1)": float(db[2]),
        "balanced ratio": float(db[2] / db[3]),
        "balanced |phi'|/phi^2 at z=10": float(gradient_over_weight(bal, z[3:4])[0]),
    }


def compute(params: dict) -> dict:
    z = torch.linspace(params["z_min"], params["z_max"], params["points"], dtype=F64)
    out = {"z": _f(z), "gates": {}, "precision": {}}
    for name, gate in GATES.items():
        v = gate.value(z)
        out["gates"][name] = {
            "value": _f(v),
            "complement": _f(gate.complement(z)),
            "derivative": _f(gate.derivative(z)),
            "grad_over_weight": _f(gradient_over_weight(gate, z)),
            "stable_scale": _f(stable_gradient_scale(gate, z)),
        }
        for arith in PRECISIONS[1:]:
            zl = z.to(arith.dtype)
            ref = gate.value(zl.to(F64))  # float64 value at the same (rounded) z
            err = (
                (gate.value(zl, bf16_mode=arith.mode).to(F64) - ref).abs() / ref.abs()
            ).nan_to_num(0.0)
            out["precision"][f"{name}|{arith.label}"] = _f(err)
            if name == "softplus":
                printed = GATES["softplus"].printed_value(zl, bf16_mode=arith.mode).to(F64)
                out["precision"][f"softplus printed|{arith.label}"] = _f(
                    ((printed - ref).abs() / ref.abs()).nan_to_num(0.0)
                )
    out["printed_balanced_scale"] = _f(printed_balanced_gradient_scale(z))
    out["paper"] = paper_numbers()
    return out


def paper_rows(data: dict) -> list:
    p = data["paper"]
    ds, db10, db1 = p["sigma'(4.6)"], p["phi'(10)"], p["phi'(1)"]
    scale10 = p["balanced |phi'|/phi^2 at z=10"]
    return [
        C.PaperRow("sigma'(4.6) (alpha = 0.99)", "~0.01", f"{ds:.4f}", C.rounds_to(ds, "0.01")),
        C.PaperRow(
            "sigma'(0) / sigma'(4.6)",
            "100x",
            f"{p['sigmoid ratio']:.2f}x",
            False,
            "the printed '100x smaller' is 25x (docs/errata.md, gate proposal)",
        ),
        C.PaperRow("phi'(10) (alpha = 0.99)", "~0.002", f"{db10:.5f}", C.rounds_to(db10, "0.002")),
        C.PaperRow("phi'(1) (alpha = 0.5)", "0.5", f"{db1:.4f}", C.rounds_to(db1, "0.5")),
        C.PaperRow(
            "phi'(1) / phi'(10)",
            "250x",
            f"{p['balanced ratio']:.1f}x",
            None,
            "approximate ('The ratio is 250x'); 255 rounds to 260 at 2 digits",
        ),
        C.PaperRow(
            "balanced |phi'|/phi^2 at z = 10",
            "2|z| = 20",
            f"{scale10:.3g}",
            math.isclose(scale10, 20.0, rel_tol=1e-6),
            "= 2a|z|/(a z^2 + b - 1)^2 (2|z| only at |z| = 1); |phi'|/(1-phi)^2 is the one equal to 2a|z|",
        ),
    ]


def same_as_sigmoid(errors: dict) -> bool:
    """Whether the stable softplus form's errors equal the sigmoid's in every precision (it is
    the sigmoid, ``solvers.gates``): then panel (d) draws them once, as one legend entry."""
    labels = {k.split("|")[1] for k in errors}
    return all(errors.get(f"softplus|{lb}") == errors.get(f"sigmoid|{lb}") for lb in labels)


def precision_curves(errors: dict) -> dict:
    """The curves of panel (d), ``{key: gate name in the legend}``: the stable softplus form is
    left out where it equals the sigmoid (drawn on top, it hid the sigmoid curve that the legend
    listed)."""
    merged = same_as_sigmoid(errors)
    out = {}
    for key in errors:
        name = key.split("|")[0]
        if merged and name == "softplus":
            continue
        out[key] = name
    return out


def _gate_legend_label(name: str, merged: bool) -> str:
    if name == "sigmoid" and merged:
        return "sigmoid\n= softplus (stable)"
    return name + (" (stable)" if name == "softplus" else "")


def _precision_panel(ax, z: list, errors: dict) -> None:
    """Panel (d): colour = gate, line style = precision, two legends beside the panel (twelve
    curves would bury the data under one legend); each precision's unit roundoff is labelled."""
    from matplotlib.lines import Line2D

    merged = same_as_sigmoid(errors)
    for key, name in precision_curves(errors).items():
        label = key.split("|")[1]
        col = "black" if "printed" in name else COLORS[name.split()[0]]
        ax.plot(z, C.positive(errors[key]), color=col, ls=C.PRECISION_STYLES[label], lw=1.0)
    for arith in PRECISIONS[1:]:
        if arith.mode == "strict":
            continue  # the same u_store as bf16 storage
        ax.axhline(arith.u_store, color="gray", lw=0.6)
        short = "bf16" if arith.dtype == torch.bfloat16 else arith.label
        ax.text(
            z[0], arith.u_store * 1.6, f"u {short} = {arith.u_store:.1e}", fontsize=6, color="0.3"
        )
    C.finish_axis(
        ax,
        xlabel="z",
        ylabel="relative error of phi(z)",
        title="(d) gate value in each precision",
        legend=False,
    )
    gates = [
        Line2D([], [], color=COLORS[n], label=_gate_legend_label(n, merged))
        for n in COLORS
        if not (merged and n == "softplus")
    ]
    gates.append(Line2D([], [], color="black", label="softplus as printed\n1 - exp(-softplus z)"))
    first = ax.legend(
        handles=gates,
        title="gate",
        fontsize=6,
        title_fontsize=7,
        loc="upper left",
        bbox_to_anchor=(1.02, 1.0),
        frameon=False,
    )
    ax.add_artist(first)
    styles = [
        Line2D([], [], color="black", ls=C.PRECISION_STYLES[a.label], label=a.label)
        for a in PRECISIONS[1:]
    ]
    ax.legend(
        handles=styles,
        title="precision",
        fontsize=6,
        title_fontsize=7,
        handlelength=3.5,  # long enough that dash-dot (bf16 storage) does not read as solid
        loc="lower left",
        bbox_to_anchor=(1.02, 0.0),
        frameon=False,
    )


def render(out_dir: pathlib.Path, params: dict, data: dict) -> list:
    z = data["z"]
    fig, axes = C.subplots(4, width=4.4)
    fig.set_size_inches(4.4 * 4 + 1.4, 3.6)  # room for panel (d)'s legends beside it
    ax = axes[0][0]
    for name, g in data["gates"].items():
        ax.plot(
            z,
            g["value"],
            color=COLORS[name],
            lw=1.5 if name != "softplus" else 3.0,
            alpha=1.0 if name != "softplus" else 0.35,
            label=f"{name}",
        )
    C.finish_axis(
        ax,
        xlabel="z",
        ylabel="gate value phi(z)",
        logy=False,
        title="(a) gate value (softplus = sigmoid)",
    )
    ax = axes[0][1]
    for name, g in data["gates"].items():
        if name == "softplus":
            continue
        keep = [
            (-math.log10(c), d)
            for c, d, v in zip(g["complement"], g["derivative"], g["value"])
            if 0 < c < 1 and v >= 0.5 and d > 0
        ]
        ax.plot(
            [k[0] for k in keep],
            [k[1] for k in keep],
            color=COLORS[name],
            label=f"{name}: phi' (phi >= 1/2)",
        )
    ax.axvline(2.0, color="gray", ls=":", lw=0.8, label="phi = 0.99")
    C.finish_axis(
        ax,
        xlabel="-log10(1 - phi)  (memory length ~ 10^x)",
        ylabel="phi'(z)",
        title="(b) gradient vs gate value near 1",
    )
    ax = axes[0][2]
    zpos = [(zi, i) for i, zi in enumerate(z) if zi > 0]
    for name in ("sigmoid", "balanced"):
        g = data["gates"][name]
        ax.plot(
            [zi for zi, _ in zpos],
            C.positive([g["grad_over_weight"][i] for _, i in zpos]),
            color=COLORS[name],
            label=f"{name}: |phi'|/phi^2",
        )
        ax.plot(
            [zi for zi, _ in zpos],
            C.positive([g["stable_scale"][i] for _, i in zpos]),
            color=COLORS[name],
            ls="--",
            label=f"{name}: |phi'|/(1-phi)^2",
        )
    ax.plot(
        [zi for zi, _ in zpos],
        [data["printed_balanced_scale"][i] for _, i in zpos],
        color="black",
        ls=":",
        label="printed: 2|z|",
    )
    C.finish_axis(
        ax,
        xlabel="z > 0",
        ylabel="gradient scale",
        title="(c) gradient-over-weight ratios",
        legend_size=6,
    )
    ax.set_ylim(1e-14, 1e14)
    ax = axes[0][3]
    _precision_panel(ax, z, data["precision"])
    files = C.save_figure(
        fig, out_dir, NAME, "Decay-gate parameterisations (gate reparameterisation proposal)"
    )
    rows = []
    for i, zi in enumerate(z):
        row = {"z": zi}
        for name, g in data["gates"].items():
            row.update({f"{name}_{k}": v[i] for k, v in g.items()})
        row["printed_balanced_scale"] = data["printed_balanced_scale"][i]
        row.update({f"relerr {k}": v[i] for k, v in data["precision"].items()})
        rows.append(row)
    files += C.write_data(
        out_dir, NAME, rows, {"params": params, "paper_numbers": data["paper"]}, paper_rows(data)
    )
    return files


run = C.figure_runner(__name__)
