"""The Zhang–Shu positivity limiter of the DG token densities, and the transpose of its derivative on the box.

Zhang & Shu (J. Comput. Phys. 229, 2010): on a cell K whose nodal minimum v_min is negative, the polynomial is
scaled toward its cell mean v̄ = Σ_j q_j v_j (q_j = m_j / Σ_K m, the lumped weights),

    u_i = v̄ + θ (v_i − v̄),     θ = v̄ / (v̄ − v_min) ∈ [0, 1),

so the nodal minimum becomes 0 and the mean is kept (mass is conserved). For P1/Q1 the nodal minimum is the
minimum over the cell. :func:`zhang_shu` is that scaling, for every domain's DG solver (the box's :func:`limit`, the
circle's and the sphere's, which pass their exact cell minima and quadrature means).

The discrete adjoint (:mod:`mfpde.tokens.box.adjoint`) differentiates the limited SSP-RK3 stages, so it needs Lᵀ for
each application L of the limiter: with D = v̄ − v_min = v̄ − v_{i*},

    ∂u_i/∂v_j = q_j (1 − θ) + θ δ_ij + (v_i − v̄) ∂θ/∂v_j,     ∂θ/∂v_j = (−q_j v_{i*} + v̄ δ_{j i*}) / D²,
    (Lᵀ p)_j = q_j (1 − θ) Σ_i p_i + θ p_j + (Σ_i p_i (v_i − v̄)) ∂θ/∂v_j,

with p_{i*} left out: u_{i*} = 0 for every v (row i* of the Jacobian is exactly zero), and the costate there
holds the derivative with respect to a zero weight, which may be huge (:func:`~mfpde.tokens.attention.support_only`).
Where v̄ ≤ 0 the limited cell is identically 0 (θ = 0, then clipped) and Lᵀ p = 0 there. Without Lᵀ the reverse
pass treated the limiter as the identity, which on meshes of 2–8 cells gave first variations of 1e73–1e111 where
finite differences give at most ~800 (issue 14).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = ["LimiterRecord", "limit", "limit_transpose", "zhang_shu"]

Array = npt.NDArray[np.float64]


@dataclass(frozen=True)
class LimiterRecord:
    """One application of the limiter, restricted to the cells it scaled: what :func:`limit_transpose` needs.

    Attributes:
        dofs: the local DG dofs of the limited cells, shape (L, k) (k dofs a cell).
        q: the lumped weights normalised per cell, shape (L, k).
        dev: v_i − v̄ before limiting, shape (L, k).
        mean: v̄, shape (L,).
        theta: θ, shape (L,).
        imin: the index i* of the nodal minimum within the cell, shape (L,).
    """

    dofs: npt.NDArray[np.int32]
    q: Array
    dev: Array
    mean: Array
    theta: Array
    imin: npt.NDArray[np.int64]


def zhang_shu(values: Array, mean: Array, vmin: Array) -> tuple[Array, Array]:
    """The Zhang–Shu scaling of the cells' values toward their means: (v̄ + θ (v − v̄), θ), θ = v̄/(v̄ − v_min) in [0, 1].

    Args:
        values: the values of each cell (its dofs), shape (n, k).
        mean: v̄ of each cell, shape (n,).
        vmin: v_min of each cell (its minimum, below 0 where the scaling is applied), shape (n,).
    """
    theta = np.clip(mean / (mean - vmin), 0.0, 1.0)
    return mean[:, None] + theta[:, None] * (values - mean[:, None]), theta


def limit(values: Array, cell_dofs: npt.NDArray[np.int32], m: Array) -> LimiterRecord | None:
    """Apply the limiter in place to ``values`` (local DG1 dofs); return what its transpose needs (None: no cell).

    Args:
        values: the local dof values (owned and ghost), shape (n_local,); changed in place.
        cell_dofs: the dofs of each local cell, shape (n_cells, k).
        m: the lumped mass of each local dof, shape (n_local,).
    """
    vals = values[cell_dofs]
    mw = m[cell_dofs]
    mean = (vals * mw).sum(axis=1) / mw.sum(axis=1)
    vmin = vals.min(axis=1)
    bad = np.flatnonzero(vmin < 0)
    if not len(bad):
        return None
    mb, vb = mean[bad], vals[bad]
    scaled, theta = zhang_shu(vb, mb, vmin[bad])
    # The limited minimum is 0 in exact arithmetic; it is set to exactly 0 (|change| ~ 1e-16 mean), not left at a
    # round-off residue of either sign. A residue of 1e-21 is a point in the support of μ, and the saturated softmax
    # weighs it by e^{a x·Δy} (e^{75} at a = 300, Δy = 0.08): the velocity at the next vertex jumped by 2% with the
    # sign of a rounding, ŷ was not continuous in c, and the reverse pass (which holds u_{i*} ≡ 0) disagreed with
    # finite differences by 2% (issue 14: one token at x = −3, DG1, heads around a = 300).
    lim = np.maximum(scaled, 0.0)
    lim[vb == vmin[bad][:, None]] = 0.0
    values[cell_dofs[bad]] = lim
    q = mw[bad] / mw[bad].sum(axis=1, keepdims=True)
    return LimiterRecord(cell_dofs[bad], q, vb - mb[:, None], mb, theta, vb.argmin(axis=1))


def limit_transpose(rec: LimiterRecord | None, p: Array) -> Array:
    """Lᵀ p for the costate p on the owned dofs (shape (n_owned,)); a new array (p itself if ``rec`` is None).

    Cells with a dof beyond p (ghost cells) are skipped: their owner transposes them.
    """
    if rec is None:
        return p
    own = (rec.dofs < len(p)).all(axis=1)
    dofs, q, dev, mean, theta, imin = (rec.dofs[own], rec.q[own], rec.dev[own], rec.mean[own], rec.theta[own],
                                       rec.imin[own])
    rows = np.arange(len(dofs))
    P = p[dofs]
    P[rows, imin] = 0.0  # u_{i*} ≡ 0: its costate does not reach v
    D = -dev[rows, imin]  # v̄ − v_min ≥ 0, and 0 only where v̄ < 0 (the cell is then 0)
    D = np.where(D > 0.0, D, 1.0)
    # ∂θ/∂v = ((1 − θ) q + θ e_{i*}) / D (θ = v̄/D): no D², which underflows for cells of ~1e-160; and R/D is
    # bounded by |P|/min q, since every |v_i − v̄| ≤ D/q_i for a weighted mean.
    dtheta = (1.0 - theta)[:, None] * q
    dtheta[rows, imin] += theta
    S, R = P.sum(axis=1), (P * dev).sum(axis=1) / D
    out = q * ((1.0 - theta) * S)[:, None] + theta[:, None] * P + R[:, None] * dtheta
    out[mean <= 0.0] = 0.0  # the limited cell is identically 0
    res = p.copy()
    res[dofs] = out
    return res
