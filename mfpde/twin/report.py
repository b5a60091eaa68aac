"""The comparison of ``mfpde twin``: gaps per size, seed and output step, the fitted exponents, the warnings.

Reads the twins' histories (:class:`mfpde.twin.train.TwinHistory`) and the PDE run (:class:`mfpde.twin.pde.PdeRun`);
writes nothing but ``history.csv`` (:func:`write_history`).
"""

from __future__ import annotations

import csv
import io
import math
from typing import TYPE_CHECKING, Any

import numpy as np

from mfpde.errors import ConfigError
from mfpde.twin.pde import PdeRun

if TYPE_CHECKING:
    from mfpde.twin.config import Section
    from mfpde.twin.sizes import Size

__all__ = ["DIVERGED", "SWEEPS", "compare", "diverged", "history_csv", "token_w1", "twin_warnings"]

#: Heads of the twin outside the Θ box (fraction, at the last step) above which the report names the box.
OUTSIDE_WARN = 1e-3
#: Outputs of the report: the sweeps and their quantities.
SWEEPS = ("heads", "tokens", "layers")


def compare(sec: Section, sizes: list[Size], hist: dict[tuple[int, int, int], Any], pde: PdeRun,
             err: dict[str, float]) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
    """Gaps per size, seed and output step; the fitted exponents; the history rows; the summary per size."""
    from mfpde.twin.compare import ProjectedDensity, fit_gaps

    tw = sec.twin
    n_out = min(len(pde.steps), min(len(h.steps) for h in hist.values()))
    for h in hist.values():  # the same output steps on both sides (--pde checks output.every)
        if not np.array_equal(h.steps[:n_out], pde.steps[:n_out]):
            raise ConfigError(f"the PDE's output steps {pde.steps[:n_out].tolist()} are not the twin's "
                              f"{h.steps[:n_out].tolist()} (output.every)")
    proj = ([ProjectedDensity(pde.rho_points, pde.rho[k]) for k in range(n_out)]
            if pde.rho and len(pde.rho) >= n_out else [])
    rows: list[dict[str, Any]] = []
    final: dict[tuple[str, int, int, int], dict[str, Any]] = {}
    for sz in sizes:
        h = hist[sz.key]
        ref = hist.get((sz.H, 0, sz.L)) if sz.sweep == "tokens" else None
        S = h.risk.shape[0]
        w1 = np.full((S, n_out), np.nan)
        if proj and h.heads.shape[-1] == pde.rho_points.shape[1]:
            for k in range(n_out):
                for s in range(S):
                    w1[s, k] = proj[k].w1(h.heads[k, s, 0])
        gap = h.risk[:, :n_out] - pde.risk[None, :n_out]
        yg = np.mean(np.abs(h.yhat[:, n_out - 1] - pde.yhat[None]), axis=1)
        final[(sz.sweep, *sz.key)] = {
            "risk": gap[:, -1], "rho_w1": w1[:, -1], "yhat": yg,
            "paired_risk": (h.risk[:, n_out - 1] - ref.risk[:, n_out - 1]) if ref is not None else None,
            "paired_yhat": (np.mean(np.abs(h.yhat[:, n_out - 1] - ref.yhat[:, n_out - 1]), axis=1)
                            if ref is not None else None),
            "paired_yhat_signed": (np.mean(h.yhat[:, n_out - 1] - ref.yhat[:, n_out - 1], axis=1)
                                   if ref is not None else None),
            "signed_yhat": np.mean(h.yhat[:, n_out - 1] - pde.yhat[None], axis=1)}
        for s in range(S):
            for k in range(n_out):
                rows.append({"sweep": sz.sweep, "heads": sz.H, "tokens": sz.N, "layers": sz.L, "seed": s,
                             "step": int(h.steps[k]), "s": h.steps[k] * sec.training.ds, "risk": h.risk[s, k],
                             "test_risk": h.test_risk[s, k], "train_accuracy": h.train_acc[s, k],
                             "test_accuracy": h.test_acc[s, k], "pde_risk": pde.risk[k],
                             "pde_test_accuracy": pde.test_acc[k], "risk_gap": gap[s, k],
                             "rho_w1": w1[s, k], "yhat_gap": yg[s] if k == n_out - 1 else math.nan})
    exps: dict[str, Any] = {}
    n_last = n_out - 1
    for sweep in SWEEPS:
        mine = [sz for sz in sizes if sz.sweep == sweep]
        if not mine:
            continue
        xs = [sz.H if sweep == "heads" else sz.N if sweep == "tokens" else sz.L for sz in mine]
        got = [final[(sweep, *sz.key)] for sz in mine]
        q: dict[str, Any] = {}
        if sweep == "heads":
            q["risk"] = fit_gaps(xs, np.stack([g["risk"] for g in got]), err["risk"], -0.5)
            q["risk_bias"] = fit_gaps(xs, np.stack([g["risk"] for g in got]), err["risk"], -1.0, signed=True)
            if not np.all(np.isnan([g["rho_w1"] for g in got])):
                q["rho_w1"] = fit_gaps(xs, np.stack([g["rho_w1"] for g in got]), err["rho_w1"], -0.5)
            q["yhat"] = fit_gaps(xs, np.stack([g["yhat"] for g in got]), err["yhat"], -0.5)
        elif sweep == "tokens":
            e = -0.5 if tw.sampling == "iid" else None  # no exponent is claimed for stratified tokens
            q["risk"] = fit_gaps(xs, np.stack([g["paired_risk"] for g in got]), 0.0, e)
            q["risk_bias"] = fit_gaps(xs, np.stack([g["paired_risk"] for g in got]), 0.0,
                                      -1.0 if tw.sampling == "iid" else None, signed=True)
            q["yhat"] = fit_gaps(xs, np.stack([g["paired_yhat"] for g in got]), 0.0, e)
            q["yhat_bias"] = fit_gaps(xs, np.stack([g["paired_yhat_signed"] for g in got]), 0.0,
                                      -1.0 if tw.sampling == "iid" else None, signed=True)
        else:  # e_L ≈ (R_L − R_L')/(1 − L/L') for the next L' (exact for e_L = C/L), paired seeds
            order = np.argsort(xs)
            Ls = [xs[i] for i in order]
            r = [hist[mine[i].key].risk[:, n_last] for i in order]
            y = [hist[mine[i].key].yhat[:, n_last] for i in order]
            if len(Ls) >= 2:
                q["risk"] = fit_gaps(Ls[:-1], np.stack([(r[k] - r[k + 1]) / (1 - Ls[k] / Ls[k + 1])
                                                        for k in range(len(Ls) - 1)]), 0.0, -1.0, signed=True)
                q["yhat"] = fit_gaps(Ls[:-1], np.stack([np.mean(y[k] - y[k + 1], axis=1) / (1 - Ls[k] / Ls[k + 1])
                                                        for k in range(len(Ls) - 1)]), 0.0, -1.0, signed=True)
        exps[sweep] = q
    summary = {f"{sz.sweep}:H={sz.H},N={sz.N or 'limit'},L={sz.L}": {
        "risk_mean": float(hist[sz.key].risk[:, n_out - 1].mean()),
        "risk_se": float(hist[sz.key].risk[:, n_out - 1].std(ddof=1) / math.sqrt(tw.seeds)),
        "test_accuracy_mean": float(np.nanmean(hist[sz.key].test_acc[:, n_out - 1]))
        if np.isfinite(hist[sz.key].test_acc[:, n_out - 1]).any() else None,
        "train_accuracy_mean": float(np.nanmean(hist[sz.key].train_acc[:, n_out - 1]))
        if np.isfinite(hist[sz.key].train_acc[:, n_out - 1]).any() else None,
        "risk_seeds": hist[sz.key].risk[:, n_out - 1].tolist(), "cpu_s": hist[sz.key].cpu_s} for sz in sizes}
    return exps, rows, summary


def _mu_atoms(mu: Any, i: int) -> tuple[np.ndarray, np.ndarray]:
    """μ_T of training input i as atoms: the cell centroids, each with the cell's mass (the field's integral)."""
    x, c = np.asarray(mu.points[i]), np.asarray(mu.cells[i])
    d = 1 if np.allclose(x[:, 1:], 0.0) else 2
    return x[c][:, :, :d].mean(axis=1), np.maximum(mu.cell_integrals(i), 0.0)


def token_w1(sizes: list[Size], hist: dict[tuple[int, int, int], Any], pde: PdeRun) -> dict[str, Any]:
    """W1 (d = 1) or sliced W1 (d = 2) between the twins' token clouds at depth T and the PDE's μ_T.

    Per traced input (the mean over seeds), for the largest heads size and each tokens size.
    """
    from mfpde.twin.compare import w1_tokens

    if pde.mu_T is None:
        return {}
    out: dict[str, Any] = {}
    picks = [sz for sz in sizes if sz.sweep == "tokens"] + [max((s for s in sizes if s.sweep == "heads"),
                                                               key=lambda s: s.H, default=None)]
    for sz in picks:
        if sz is None:
            continue
        h = hist[sz.key]
        if h.tokens_T.size == 0:
            continue
        vals = []
        for i in range(h.tokens_T.shape[1]):
            pts, mass = _mu_atoms(pde.mu_T, i)
            vals.append(float(np.mean([w1_tokens(h.tokens_T[s, i], h.token_weights[s, i], pts, mass)
                                       for s in range(h.tokens_T.shape[0])])))
        out[f"H={sz.H},N={sz.N or 'limit'},L={sz.L}"] = vals
    return out


def twin_warnings(sec: Section, sizes: list[Size], hist: dict[tuple[int, int, int], Any], pde: PdeRun,
              exps: dict[str, Any]) -> list[str]:
    """Where the limit is the wrong model, or the discretisation decides the answer: say so."""
    out = []
    box = np.asarray(sec.heads.box, float)
    worst = 0.0
    for sz in sizes:
        th = hist[sz.key].heads[-1]
        outside = np.any((th < box[:, 0]) | (th > box[:, 1]), axis=-1)
        worst = max(worst, float(outside.mean()))
    if worst > OUTSIDE_WARN:
        edge = _boundary_mass(pde)
        out.append(f"heads.box: up to {worst:.3g} of the twin's heads are outside Θ at the last step (particles have "
                   f"no box; the PDE's ρ has a no-flux boundary, mass {edge:.3g} in its boundary cells): the gaps "
                   "stop falling where the box, not the model, decides ρ; enlarge heads.box")
    outflow = float(pde.report.get("final", {}).get("token_outflow", 0.0) or 0.0)
    if outflow > 1e-3:
        out.append(f"tokens.box: up to {outflow:.3g} of a sample's token mass left Ω in the PDE (the twin's tokens are "
                   "never lost): enlarge tokens.box")
    key = {"heads": "twin.heads", "tokens": "twin.tokens", "layers": "twin.layers"}
    for sweep, q in exps.items():
        if q and all(fit["note"] == "a single size: no exponent" for fit in q.values()):
            out.append(f"{key[sweep]}: a single size: no exponents of the {sweep} sweep")
            continue
        for name, fit in q.items():
            if fit["note"]:
                out.append(f"{key[sweep]}: {name}: {fit['note']}")
    return out


def _boundary_mass(pde: PdeRun) -> float:
    """The PDE's ρ mass in the cells at the boundary of Θ at the last step (nodal values × cell size)."""
    if not pde.rho:
        return math.nan
    pts, r = pde.rho_points, np.maximum(pde.rho[-1], 0.0)
    lo, hi = pts.min(axis=0), pts.max(axis=0)
    h = np.array([np.diff(np.unique(np.round(pts[:, j], 12))).min() for j in range(pts.shape[1])])
    edge = np.any((pts <= lo + 1.5 * h) | (pts >= hi - 1.5 * h), axis=1)
    return float((r[edge].sum()) / r.sum())


#: A twin whose risk ends above this multiple of the largest of its own initial risk and the PDE's has diverged.
DIVERGED = 10.0


def diverged(h: Any, pde: PdeRun) -> bool:
    """Whether a size's explicit training blew up (its final risk far above where it and the PDE started)."""
    top = DIVERGED * max(float(np.nanmax(h.risk[:, 0])), float(np.nanmax(pde.risk)))
    return bool(h.diverged or np.any(~np.isfinite(h.risk[:, -1])) or np.nanmax(h.risk[:, -1]) > top)


def history_csv(rows: list[dict[str, Any]]) -> str:
    """The text of ``history.csv`` of the rows (:func:`compare`; the job writes it), "" without rows."""
    if not rows:
        return ""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: (f"{v:.12g}" if isinstance(v, float) else v) for k, v in r.items()})
    return buf.getvalue()

