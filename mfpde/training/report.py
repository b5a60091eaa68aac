"""What the ``run`` report says, each statement only where it is true (interface.md, outputs.md).

* :func:`run_report`, :func:`rate_block`: the report without the final outputs; the certificate
  F − F* ≤ λ KL(ρ ‖ p_ρ) of theory §5.4 is used as a bound only where R is convex in ρ
  (:func:`certificate_bound`);
* :func:`theta_boundary_mass`: ρ's mass in the Θ cells touching ∂Θ (the no-flux box holding the heads);
* :func:`free_energy_rises`: increases of F between history rows beyond their round-off (any λ; with λ = 0 the
  risk plus confinement);
* :func:`accuracy_block`: sign accuracy of ρ₀ and ρ_S, against the better of ρ₀'s readout and its sign flip;
"""

from __future__ import annotations

import logging
from typing import Any

from mpi4py import MPI

import dolfinx.fem
import dolfinx.mesh
import numpy as np
import ufl

from mfpde import __version__
from mfpde.heads import HeadMeasure
from mfpde.training.problem import CoupledProblem
from mfpde.training.theory import certified_fit, theoretical_rate

__all__ = ["BOUNDARY_MASS_WARN", "OUTFLOW_WARN", "accuracy_block", "certificate_bound", "free_energy_rises",
           "rate_block", "run_report", "theta_boundary_mass"]

logger = logging.getLogger(__name__)

#: Mass of ρ_S in the Θ cells touching ∂Θ above which the report warns that ``heads.box`` holds the heads.
BOUNDARY_MASS_WARN = 1e-2
#: Fraction of ∫μ_0 leaving Ω (largest over the training samples) above which the report warns on ``tokens.box``.
OUTFLOW_WARN = 1e-2


def certificate_bound(cp: CoupledProblem) -> tuple[bool, str]:
    """Whether λ KL(ρ ‖ p_ρ) bounds F(ρ) − F* at the current ρ (theory §5.4), and why (not). Collective.

    The bound needs the tangent inequality R(ρ*) ≥ R(ρ) + ∫ δR/δρ (ρ* − ρ) at the minimiser ρ*, which convexity of
    R in ρ gives. The discrete ŷ of the upwind token scheme is linear in ρ only while no facet's upwind side
    changes; it changes with ρ wherever the token velocity combines several head fields (``scalar`` heads: one
    field per a), so there R is not convex in general (measured: λ KL up to 1.8× below F − F* on digits). With
    ``value`` heads on the single-layer model the velocity is c·A(x), one field A and c = ∫v dρ: ŷ^i is affine in c
    on each side of c = 0 and R(c) is a convex quadratic there. R is convex iff its slope does not drop at c = 0,
    R'(0⁺) ≥ R'(0⁻), computed from ŷ at c = 0 and ±1 (three forward passes, independent of ρ, done once). Where it
    drops but R'(0⁺), R'(0⁻) have one sign and Θ is symmetric in v (so the entropic confinement's share of F,
    convex in c, is stationary at c = 0), the minimiser has c* of the opposite sign; the bound then holds at every
    ρ with c(ρ) on that side.

    Returns:
        (bound, reason): the reason says what the certificate is where it is not a bound.
    """
    pb, st = cp.problem, cp.state
    if st.lam <= 0:
        return False, "no certificate: λ = 0"
    if not pb.shallow:
        return False, "certificate not a bound here: R is not convex in ρ for a deep model (theory §2)"
    if cp.family.name != "value":
        return False, ("certificate not a bound here: ŷ is not linear in ρ (the upwind side of token facets switches "
                       "with ρ for scalar heads), λ KL(ρ ‖ p_ρ) is an estimate of F − F*, not a bound")
    slopes = getattr(cp, "_risk_slopes", None)
    if slopes is None:
        a = np.atleast_1d(cp.family.a(np.zeros((1, cp.family.p)))).astype(float)
        y = {c: cp.objective.predict(pb.train, [HeadMeasure(a, np.array([c]))]) for c in (-1.0, 0.0, 1.0)}
        r0 = y[0.0] - np.array([s.target for s in pb.train])
        scale = float(np.mean(np.abs(r0) * (np.abs(y[1.0]) + 2 * np.abs(y[0.0]) + np.abs(y[-1.0])))) + 1e-300
        v = np.asarray(cp.theta.points)[:, 0]
        symmetric = bool(np.allclose(np.sort(v), np.sort(-v), rtol=0, atol=1e-12 * max(1.0, float(np.abs(v).max()))))
        # R'(0⁺), R'(0⁻), the round-off of the three evaluations' differences, Θ symmetric in v
        slopes = (float(np.mean(r0 * (y[1.0] - y[0.0]))), float(np.mean(r0 * (y[0.0] - y[-1.0]))),
                  64 * np.finfo(float).eps * scale, symmetric)
        cp._risk_slopes = slopes  # type: ignore[attr-defined]
    right, left, tol, symmetric = slopes
    if right - left >= -tol:
        return True, "certificate a bound: value heads on the single-layer model, R convex in c = ∫v dρ"
    kink = f"R(c) of value heads is not convex at c = ∫v dρ = 0 (its slope drops by {left - right:.3g})"
    c = sum(h.abar for h in cp.heads())
    if symmetric and min(abs(right), abs(left)) > tol and right * left > 0 and c * right < 0:
        return True, (f"certificate a bound: {kink}, but R'(0±) {'<' if right < 0 else '>'} 0 puts the minimiser "
                      f"on the side c {'>' if right < 0 else '<'} 0, where ρ is and R is convex")
    return False, f"certificate not a bound here: {kink}, λ KL(ρ ‖ p_ρ) is an estimate of F − F*, not a bound"


def run_report(cp: CoupledProblem, history: list[dict[str, float]], status: str, step: int,
               wall: float) -> dict[str, Any]:
    """The ``run`` report of interface.md without the final outputs (NTK, accuracy). Collective.

    ``final`` takes risk, free energy, mass and min of ρ from the last history row, ρ's moments and Gibbs
    residual from :func:`mfpde.params.free_energy.diagnostics` against the last Φ, and
    ``theta_boundary_mass`` (:func:`theta_boundary_mass`; the largest over layer blocks, each block's in
    ``theta_boundary_mass_blocks`` for depth-indexed models). ``warnings`` (a list of strings, empty when
    nothing is to be said) names the key to change: ``heads.box`` when ρ_S keeps more than
    :data:`BOUNDARY_MASS_WARN` by ∂Θ, ``training.ds`` when F rose beyond round-off (any λ: with λ = 0, F is
    R + (λ₂/2)∫|θ|²dρ, the risk itself for λ₂ = 0, and the flow descends it all the same).
    """
    st = cp.state
    final = dict(history[-1]) if history else {}
    diag = [st.fp.diagnostics(r, phi) for r, phi in zip(st.rhos, st.phis, strict=True)]
    one = st.n_layers == 1
    fin: dict[str, Any] = {"risk": final.get("risk"), "free_energy": final.get("free_energy"),
                           "mass_rho": final.get("mass_rho"), "min_rho": final.get("min_rho"),
                           "rho_mean": diag[0]["mean"] if one else [d["mean"] for d in diag],
                           "rho_cov": diag[0]["cov"] if one else [d["cov"] for d in diag]}
    if st.lam > 0:
        g = [d["l1_gibbs"] for d in diag]
        fin["gibbs_residual_l1"] = g[0] if one else g
    warnings: list[str] = []
    edge = theta_boundary_mass(cp)
    fin["theta_boundary_mass"] = max(edge)
    if not one:
        fin["theta_boundary_mass_blocks"] = edge
    if max(edge) > BOUNDARY_MASS_WARN:
        which = "" if one else f" (layer block {int(np.argmax(edge))})"
        warnings.append(f"heads.box: ρ keeps {max(edge):.3g} of its mass in the Θ cells touching the box's boundary"
                        f"{which}: the no-flux boundary of Θ, not the model, holds the heads; enlarge heads.box "
                        "(or raise training.lambda2)")
    warnings += free_energy_rises(cp, history)  # λ = 0 too: F = R + (λ₂/2)∫|θ|²dρ is what the flow descends
    rate = rate_block(cp, history)
    return {"status": status, "command": "run", "version": __version__, "comm_size": cp.comm.size,
            "wall_s": wall, "steps_done": step, "final": fin, "rate": rate, "warnings": warnings}


def theta_boundary_mass(cp: CoupledProblem) -> list[float]:
    """∫ ρ^ℓ over the Θ cells with a vertex on ∂Θ, per layer block (a fraction of ρ's mass 1). Collective."""
    form = getattr(cp, "_edge_form", None)
    theta = cp.theta
    if form is None:
        msh = theta.V.mesh
        tdim = msh.topology.dim
        msh.topology.create_connectivity(tdim - 1, tdim)
        facets = dolfinx.mesh.exterior_facet_indices(msh.topology)
        on_edge = dolfinx.fem.Function(theta.V)
        on_edge.x.array[dolfinx.fem.locate_dofs_topological(theta.V, tdim - 1, facets)] = 1.0
        on_edge.x.scatter_forward()
        chi = dolfinx.fem.Function(dolfinx.fem.functionspace(msh, ("DG", 0)))  # 1 on the cells touching ∂Θ
        chi.x.array[chi.function_space.dofmap.list[:, 0]] = on_edge.x.array[theta.V.dofmap.list].max(axis=1)
        rho = dolfinx.fem.Function(theta.V)
        form = (dolfinx.fem.form(chi * rho * ufl.dx), rho)
        cp._edge_form = form  # type: ignore[attr-defined]
    f, rho = form
    out = []
    for r in cp.rhos:
        rho.x.array[:] = r.x.array
        out.append(cp.comm.allreduce(float(dolfinx.fem.assemble_scalar(f).real), op=MPI.SUM))
    return out


def free_energy_rises(cp: CoupledProblem, history: list[dict[str, float]]) -> list[str]:
    """A warning if F rose between history rows by more than its round-off (F should fall, at any λ ≥ 0).

    The round-off of F = R + (λ₂/2)∫|θ|²dρ + λ∫ρ log ρ is bounded by that of its sums: the risk's over the
    n training samples and the Θ integrals' over the N_θ nodes (per block), each at most (terms)·ε·Σ|term|;
    the rows' tolerance is 4 (n + L N_θ) ε (|R| + |(λ₂/2)∫|θ|²dρ| + λ|∫ρ log ρ|), for the two rows compared.
    """
    n = len(cp.problem.train) + cp.state.n_layers * len(cp.theta.points)
    lam, rises = cp.state.lam, []
    for h0, h1 in zip(history, history[1:], strict=False):
        scale = max(abs(h["risk"]) + abs(h["free_energy"] - h["risk"] - lam * h["neg_entropy"])
                    + lam * abs(h["neg_entropy"]) for h in (h0, h1))
        tol = 4 * n * np.finfo(float).eps * scale
        if h1["free_energy"] - h0["free_energy"] > tol:
            rises.append((int(h0["step"]), int(h1["step"]), h1["free_energy"] - h0["free_energy"], tol))
    if not rises:
        return []
    worst = max(rises, key=lambda r: r[2])
    what = ("the free energy" if lam > 0 else "the risk (λ = λ₂ = 0)" if cp.state.lam2 == 0 else
            "the objective R + (λ₂/2)∫|θ|²dρ (λ = 0)")
    return [f"training.ds: {what} rose between {len(rises)} pair(s) of history rows, first from step "
            f"{rises[0][0]} to {rises[0][1]}, most ({worst[2]:.3g}, round-off {worst[3]:.1g}) from step {worst[0]} to "
            f"{worst[1]}: the splitting step is not a descent there (a smaller training.ds, or more steps to see "
            "whether it settles)"]


def rate_block(cp: CoupledProblem, history: list[dict[str, float]]) -> dict[str, Any]:
    """The ``rate`` block of the run report: each rate only where it means what it says. Collective.

    ``theory`` (with ``theory_kind``) where a theorem applies, else null with ``theory_reason``
    (:func:`mfpde.training.theory.theoretical_rate`; the deep λ = λ₂ = 0 case is completed from the NTK
    in the driver). ``fitted`` is fitted to F − F* only where F* is known independently of the run's
    last value: where the certificate of theory §5.4 is a bound (:func:`certificate_bound`;
    :func:`mfpde.training.theory.certified_fit`); ``converged`` says whether the run got there and
    ``fitted_reference`` what F* is, ``fitted_f_star`` the F* fitted jointly with the rate inside the certificate's
    bracket. Elsewhere ``fitted`` is null with the reason. ``certificate_bound``
    says whether λ KL(ρ ‖ p_ρ) bounds F − F* here (``certificate_reason`` why), ``certificate`` its last value
    (entropic runs).
    """
    st = cp.state
    theory, kind = theoretical_rate(cp.family.name, st.lam, st.lam2, st.risk_oscillation(), cp.problem.shallow)
    rate: dict[str, Any] = {"fitted": None, "converged": False, "theory": theory}
    rate["theory_kind" if theory is not None else "theory_reason"] = kind
    s = np.array([h["s"] for h in history])
    F = np.array([h["free_energy"] for h in history])
    bound, why = certificate_bound(cp)
    rate["certificate_bound"], rate["certificate_reason"] = bound, why
    if history and "kl_gibbs" in history[-1]:
        rate["certificate"] = st.lam * history[-1]["kl_gibbs"]
    if bound and len(F) > 2 and "kl_gibbs" in history[-1]:
        fitted, conv, ref, fstar = certified_fit(s, F, st.lam * history[-1]["kl_gibbs"])
        rate.update(fitted=fitted, converged=conv, fitted_reference=ref)
        if fstar is not None:
            rate["fitted_f_star"] = fstar
    else:
        rate["fitted_reference"] = "F* unknown: " + why
    return rate


def accuracy_block(targets: dict[str, np.ndarray], yhat0: dict[str, np.ndarray], yhat: dict[str, np.ndarray]
                   ) -> tuple[dict[str, Any], list[str]]:
    """Sign accuracy of ρ_S and ρ₀ per split, against the better of ρ₀'s readout and its sign flip.

    Args:
        targets: per split (``"train"``, ``"test"``) the targets, shape (n,).
        yhat0: per split ŷ of ρ₀, shape (n,) (a split may be missing).
        yhat: per split ŷ of ρ_S, shape (n,).

    Returns:
        The ``accuracy`` block: per split the accuracy of ρ_S; ``initial``: of ρ₀; ``initial_best_sign``:
        max(a₀, 1 − a₀), the accuracy of the better of ρ₀'s readout ŷ₀ and −ŷ₀ (what a sign flip of the readout
        alone gives); ``gain``: accuracy − initial_best_sign; ``agrees_with_flipped_initial``: the fraction of
        samples with sign ŷ_S = −sign ŷ₀. And the warnings: where ρ₀ is below chance and ρ_S gains nothing over
        its sign flip (``gain`` ≤ 0 on the held-out set, or the training set without one).
    """
    acc: dict[str, Any] = {}
    init, best, gain, flip = {}, {}, {}, {}
    for k in ("train", "test"):
        if k not in yhat or not len(targets[k]):
            continue
        y = np.sign(targets[k])
        acc[k] = float(np.mean(np.sign(yhat[k]) == y))
        if k in yhat0:
            a0 = float(np.mean(np.sign(yhat0[k]) == y))
            init[k], best[k] = a0, max(a0, float(np.mean(np.sign(-yhat0[k]) == y)))
            gain[k] = acc[k] - best[k]
            flip[k] = float(np.mean(np.sign(yhat[k]) == -np.sign(yhat0[k])))
    acc.update(initial=init, initial_best_sign=best, gain=gain, agrees_with_flipped_initial=flip)
    k = "test" if "test" in gain else "train"
    warnings = []
    if k in gain and init[k] < 0.5 and gain[k] <= 0:
        warnings.append(f"accuracy: {k} {acc[k]:.3f} from ρ₀'s {init[k]:.3f} is no better than ρ₀'s readout with its "
                        f"sign flipped ({best[k]:.3f}; the signs of ŷ agree with −ŷ₀ on {flip[k]:.1%} of the samples): "
                        + ("training only flipped a sign" if flip[k] > 0.5 else "training gained nothing over it"))
    return acc, warnings
