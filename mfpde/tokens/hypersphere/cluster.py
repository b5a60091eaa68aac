"""The stable clustered branch of noisy tokens on S^{d−1}, followed down in K from a strongly clustered state.

At large β·d the branch that bifurcates from the uniform state at K_c is long: its order parameter rises, falls
and rises again before it turns at the fold K_f into the stable clustered state (a single cap), and an arclength
continuation started at K_c with steps of the order of K_c (:func:`mfpde.bifurcation.noisy_branches`) left it for
other solutions of the discrete equation. Here the branch is followed from the other end: a clustered state at
a coupling K_0 where its free energy lies below the uniform state's, found by the damped fixed-point iteration
u ← log p(e^u) from the potential of a point mass, then continued in the log-density at the pole, b = u(z_n) (the
node next to z = 1), downwards, each point a Newton solve under the constraint u(z_n) = b (the continuation's
bordered Newton, :class:`~mfpde.continuation_newton.DenseNewton`). Along it K(b) falls to the fold, where
dK/db (the bordered system's implicit derivative) changes sign: K_f is the root of dK/db (Brent in b), the
smallest K at which the clustered state exists; the Maxwell point K_M is the root in b of ΔE = E(μ) − E(uniform)
between two stable points of the branch (Brent in b, :func:`~mfpde.continuation_newton.brent`, as
:func:`mfpde.bifurcation.maxwell_points` does in K).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import scipy.special

from mfpde.continuation_newton import DenseNewton, brent
from mfpde.tokens.hypersphere.stationary import HypersphereStationary

__all__ = ["ClusterTransition", "cluster_transition", "clustered_state"]

Array = npt.NDArray[np.float64]
#: The fixed-point iteration's damping (u ← (u + log p(e^u))/2), its iterations and its tolerance (times max|u|).
DAMPING, FIXED_POINT_ITS, FIXED_POINT_TOL = 0.5, 5000, 1e-11
#: Newton's tolerance is at least this times n max|u| (the residual's round-off floor: at d = 128, β = 6 a cap with
#: max|u| ≈ 1500 on 128 points left ≈ 1e-10, above the problem's own tolerance 2e-11)
ROUNDOFF = 1e-14
#: An order parameter above this is a clustered state (the uniform one has 0).
CLUSTERED = 0.5


@dataclass
class ClusterTransition:
    """The fold and the Maxwell point of the stable clustered branch on one discretisation (NaN: not found).

    Attributes:
        K_f: the fold, the least K of the clustered branch. K_M: its Maxwell point (ΔE = 0 on its stable part).
        order_fold, order_maxwell: the order parameter |∫ x dμ| there.
        K_start: the coupling K_0 the branch was started from. stable: every point swept from the last one below
        the uniform state's free energy to the fold was stable (the points above it are not examined).
        resolved: every swept point passed the problem's resolution check. points: the points swept.
        why: why a number is NaN ("" if none is).
        samples: (b, K, order parameter, ΔE, stable or None) of the swept points.
    """

    K_f: float = math.nan
    K_M: float = math.nan
    order_fold: float = math.nan
    order_maxwell: float = math.nan
    K_start: float = math.nan
    stable: bool = False
    resolved: bool = False
    points: int = 0
    why: str = ""
    samples: list[tuple[float, float, float, float, bool | None]] = field(default_factory=list)


def clustered_state(P: HypersphereStationary, K: float, u0: Array | None = None) -> Array | None:
    """A clustered stationary u at K by the damped fixed-point iteration from u0 (or a point mass's potential).

    None if it does not converge or ends at a state with order parameter ≤ :data:`CLUSTERED` (the uniform one).
    """
    if u0 is None:
        u = (K / (P.noise * P.beta)) * P.kernel[:, -1]  # κ Φ of a point mass at the pole, Φ = e^{β z}
    else:
        u = np.array(u0, float)
    u = u - u.max()
    u -= scipy.special.logsumexp(u, b=P.q)
    for _ in range(FIXED_POINT_ITS):
        new = P.residual(u, K)  # u − log p(e^u)
        if not np.all(np.isfinite(new)):
            return None
        if float(np.abs(new).max()) <= FIXED_POINT_TOL * max(1.0, float(np.abs(u).max())):
            break
        u = u - DAMPING * new
    else:
        return None
    return u if P.order_parameter(u) > CLUSTERED else None


def _dK_db(P: HypersphereStationary, x: Array, row: Array) -> float:
    """dK/db along the branch at x = (u, K): the bordered system [∂F/∂u ∂F/∂K; rowᵀ] ẋ = (0, 1)."""
    m = P.m
    Ju, JK = P.jacobian(x[:m], float(x[m]))
    J = np.zeros((m + 1, m + 1))
    J[:m, :m], J[:m, m], J[m] = Ju, JK, row
    rhs = np.zeros(m + 1)
    rhs[m] = 1.0
    return float(np.linalg.solve(J, rhs)[m])


def cluster_transition(P: HypersphereStationary, K0: float | None = None, step: float = 0.02,
                       max_points: int = 2000) -> ClusterTransition:
    """K_f and K_M of the stable clustered branch of P (module docstring).

    Args:
        P: the zonal stationary problem (any d, β above β*⁽ᵈ⁾).
        K0: the coupling to start from; by default the least of K_c 2^{−j}, j = 1, 2, ..., before the first whose
            clustered state is not found or whose free energy is not below the uniform state's, that Newton
            resolves to its tolerance.
        step: the first step in b, relative to b at K_0 (halved on a failed Newton solve, grown by 1.5 after an
            easy one, at most 4 times this).
        max_points: the most points swept.

    Returns:
        :class:`ClusterTransition`.
    """
    m = P.m
    out = ClusterTransition()
    newton = DenseNewton(P, m, atol=P.newton_atol, max_it=30)

    def newton_solve(x: Array, a: Array, b: float) -> Array | None:
        """Newton from x under aᵀx = b, its tolerance raised to the round-off of the exponent max|u| (ROUNDOFF)."""
        newton.atol = max(P.newton_atol, ROUNDOFF * m * float(np.abs(x[:m]).max()))
        return newton.solve(x, a, b)

    eK = np.eye(m + 1)[m]
    row = np.eye(m + 1)[m - 1]  # b = u at the node next to the pole

    def gap(u: Array, K: float) -> float:
        return P.free_energy(u, K) - P.free_energy(P.uniform(), K)

    x0 = None
    kc = P.threshold(1)
    for j in range(1 if K0 is None else 0, 60 if K0 is None else 1):
        K = kc * 2.0**-j if K0 is None else float(K0)
        u = clustered_state(P, K)
        if u is None or gap(u, K) >= 0:
            break
        y = newton_solve(np.concatenate([u, [K]]), eK, K)
        if y is not None:
            x0 = y  # the last (least) K_c 2^{−j} that Newton resolves with ΔE < 0
    if x0 is None:
        out.why = "no clustered state below the uniform state's free energy was found to start from"
        return out
    out.K_start = float(x0[m])
    xs, bs, ks, slopes = [x0], [float(x0[m - 1])], [float(x0[m])], [_dK_db(P, x0, row)]
    stable: list[bool | None] = []
    res: list[bool] = []
    h = step * max(abs(bs[0]), 1.0)
    h_max, h_min = 4 * h, 1e-10 * max(abs(bs[0]), 1.0)
    while len(xs) < max_points:
        b = bs[-1] - h
        x = xs[-1] if len(xs) < 2 else xs[-1] + (b - bs[-1]) / (bs[-1] - bs[-2]) * (xs[-1] - xs[-2])
        its = newton.its
        y = newton_solve(x, row, b)
        if y is None or P.order_parameter(y[:m]) <= 0.0:
            h *= 0.5
            if h < h_min:
                out.why = f"Newton failed at b = {b:.6g} (K = {ks[-1]:.10g})"
                break
            continue
        xs.append(y)
        bs.append(b)
        ks.append(float(y[m]))
        slopes.append(_dK_db(P, y, row))
        h = min(1.5 * h, h_max) if newton.its - its <= 3 else h
        if slopes[-1] <= 0 < slopes[-2]:
            break
    else:
        out.why = f"{max_points} points reached before the fold"
    out.points = len(xs)
    dE = [gap(x[:m], float(x[m])) for x in xs]
    # the stability of the points from the last one below the uniform state's free energy to the fold (the part
    # that carries K_M and K_f; above it, where ΔE is far below 0, it is not examined: None)
    below = [i for i, e in enumerate(dE) if e < 0]
    first = below[-1] if below else 0
    for i, x in enumerate(xs):
        st = P.stability(x[:m], float(x[m]), 2, "scipy")[1] if i >= first else None
        stable.append(st)
        res.append(P.resolved(x[:m]))
        out.samples.append((float(x[m - 1]), float(x[m]), P.order_parameter(x[:m]), dE[i], st))
    if not (len(slopes) >= 2 and slopes[-1] <= 0 < slopes[-2]):
        out.why = out.why or "no fold"
        return out
    out.stable = all(bool(s) for s in stable[first:-1])
    out.resolved = all(res)
    cache = {b: x for b, x in zip(bs, xs, strict=True)}

    def solve(b: float) -> Array:
        """The branch's point at b, by Newton from the nearest swept point, linearly extrapolated."""
        if b in cache:
            return cache[b]
        keys = np.array(bs)
        i = int(np.argmin(np.abs(keys - b)))
        j = i + 1 if i + 1 < len(bs) and (b - bs[i]) * (bs[i + 1] - bs[i]) > 0 else max(i - 1, 0)
        x = xs[i] + (b - bs[i]) / (bs[j] - bs[i]) * (xs[j] - xs[i]) if j != i else xs[i]
        y = newton_solve(x, row, b)
        if y is None:
            raise RuntimeError(f"Newton failed at b = {b:.10g}")
        cache[b] = y
        return y

    tol = 1e-14 * max(abs(bs[0]), 1.0)
    try:
        bf = brent(lambda b: _dK_db(P, solve(b), row), bs[-1], bs[-2], xtol=tol, rtol=1e-15)
        xf = solve(bf)
        out.K_f, out.order_fold = float(xf[m]), P.order_parameter(xf[:m])
    except RuntimeError as e:
        out.why = f"the fold: {e}"
        return out
    for i in range(first, len(xs) - 2):  # the stable part: every point but the last (past the fold)
        if stable[i] and stable[i + 1] and (dE[i] < 0) != (dE[i + 1] < 0):
            try:
                bm = brent(lambda b: gap(solve(b)[:m], float(solve(b)[m])), bs[i + 1], bs[i], xtol=tol,
                           rtol=1e-15)
            except RuntimeError as e:
                out.why = f"the Maxwell point: {e}"
                return out
            xm = solve(bm)
            out.K_M, out.order_maxwell = float(xm[m]), P.order_parameter(xm[:m])
            break
    else:
        out.why = "the stable part's free energy does not cross the uniform state's between K_0 and the fold"
    return out
