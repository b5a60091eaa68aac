"""Initial data on S² (``data.kind = "sphere_modes"`` and the seeded noise start) and a product quadrature.

* :func:`modes_density`: μ_0 = 1/4π + Σ a·Y_ℓm for ``modes = [[ℓ, m, a], ...]`` (real orthonormal Y_ℓm of
  :func:`~mfpde.tokens.sphere.harmonics.real_harmonics`, ℓ ≥ 1 so that the mass is 1 exactly), evaluated by
  :func:`~mfpde.tokens.sphere.harmonics.synthesis` in O(L n) memory.
* :func:`modes_minimum`: min over S² of μ_0, so that a configuration can refuse data negative anywhere. μ_0 is a
  polynomial of degree L on the sphere; its local minima are ≳ π/L apart, so a Fibonacci lattice of spacing
  ≈ 1/(8L) puts a point in every basin; the lowest lattice points are then polished by a local minimiser
  (scipy's L-BFGS-B on x = y/|y|, y ∈ R³, no pole singularity). Checked against a brute-force dense grid.
* :func:`noise_modes`: the sphere's counterpart of the circle's ``circle_noise`` (μ_0 = (1/2π)(1 + a·ξ), ξ white
  of unit variance per cell): μ_0 = (1/4π)(1 + a·ξ), ξ an isotropic Gaussian field band-limited to degrees 1..L of
  unit pointwise variance (i.i.d. N(0, 1) coefficients, scaled by √(4π/((L+1)² − 1))), seeded. Where the circle
  clips at 0 (which a finite set of modes cannot), the perturbation is scaled down, if needed, so that
  min μ_0 = NOISE_FLOOR/4π.
* :func:`product_quadrature`: Gauss–Legendre in cos ϑ × uniform in φ, exact for degree ≤ 2N − 1 (2N² points).
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from mfpde.tokens.sphere.harmonics import synthesis

__all__ = ["NOISE_FLOOR", "fibonacci_points", "modes_density", "modes_minimum", "noise_modes",
           "product_quadrature"]

Array = npt.NDArray[np.float64]
#: The noise start's minimum, relative to the uniform density 1/4π, when its amplitude had to be scaled down.
NOISE_FLOOR = 1e-3


def _coefficients(modes: list[list[float]]) -> tuple[int, Array]:
    """(L, the coefficient vector (L+1)² with 1/4π·√(4π) at index 0) of ``modes``; ValueError on a bad (ℓ, m)."""
    L = 0
    for mode in modes:
        if len(mode) != 3:
            raise ValueError(f"a sphere mode is [l, m, amplitude], got {mode!r}")
        ll, m = mode[0], mode[1]
        if ll != int(ll) or m != int(m) or int(ll) < 1 or abs(int(m)) > int(ll):
            raise ValueError(f"a sphere mode needs integers l >= 1 and |m| <= l, got l = {ll}, m = {m}")
        L = max(L, int(ll))
    c = np.zeros((L + 1) ** 2)
    c[0] = 1.0 / math.sqrt(4 * math.pi)  # 1/4π = c_00·Y_00, Y_00 = 1/√(4π)
    for ll, m, a in modes:
        c[int(ll) ** 2 + int(ll) + int(m)] += float(a)
    return L, c


def modes_density(modes: list[list[float]], x: npt.ArrayLike) -> Array:
    """μ_0(x) = 1/4π + Σ a·Y_ℓm(x) at the unit vectors x (n, 3): shape (n,); mass 1 for any amplitudes.

    Raises:
        ValueError: a mode that is not [ℓ, m, a] with integers ℓ ≥ 1, |m| ≤ ℓ.
    """
    L, c = _coefficients(modes)
    return np.asarray(synthesis(L, c, x)[0], dtype=np.float64)  # O(L n) memory, not the (n, (L+1)²) matrix


def fibonacci_points(n: int) -> Array:
    """Nearly uniform unit vectors (n, 3), n ≥ 1 (the Fibonacci lattice: spacing ≈ √(4π/n))."""
    k = np.arange(n) + 0.5
    z = 1.0 - 2.0 * k / n
    phi = math.pi * (3.0 - math.sqrt(5.0)) * k
    r = np.sqrt(np.maximum(0.0, 1.0 - z * z))
    return np.stack([r * np.cos(phi), r * np.sin(phi), z], axis=1)


def modes_minimum(modes: list[list[float]], candidates: int = 24) -> float:
    """The minimum over S² of μ_0 (see the module).

    A lattice of ≥ 64 L² (and ≥ 4000) points, then up to ``candidates`` lowest lattice points polished by
    L-BFGS-B to ~1e-14 in the value.

    Raises:
        ValueError: as :func:`modes_density`.
    """
    L, c = _coefficients(modes)
    if L == 0:
        return 1.0 / (4 * math.pi)
    pts = fibonacci_points(max(4000, 64 * L * L))
    vals = synthesis(L, c, pts)[0]
    best = float(vals.min())
    # a lattice point within the spacing h of the minimiser is above it by ≤ ½ |∇²μ_0| h² ≤ ½ L(L+1) sup|μ_0 − 1/4π| h²
    # (Bernstein's inequality on S²): only points within twice that of the lattice minimum can be near it
    h2 = 4 * math.pi / len(pts) * 4.0
    margin = L * (L + 1) * float(np.max(np.abs(vals - c[0] / math.sqrt(4 * math.pi)))) * h2
    order = np.argsort(vals)[:candidates]

    import scipy.optimize  # here: its import costs the commands that never minimise 0.3–0.5 s

    def f(y: Array) -> float:
        return float(synthesis(L, c, y / np.linalg.norm(y))[0][0])

    for j in order[vals[order] <= best + margin]:
        res = scipy.optimize.minimize(f, pts[j], method="L-BFGS-B", options={"ftol": 1e-15, "gtol": 1e-12})
        best = min(best, float(res.fun))
    return best


def noise_modes(amplitude: float, seed: int, L: int) -> list[list[float]]:
    """A seeded noise start as ``sphere_modes`` (see the module): [[ℓ, m, a_ℓm], ...] for ℓ = 1..L, all m.

    a_ℓm = (amplitude/4π)·√(4π/((L+1)² − 1))·z_ℓm, z_ℓm i.i.d. N(0, 1) from numpy's default_rng(seed) in the order
    ℓ² + ℓ + m; all scaled down, if needed, so that min μ_0 = NOISE_FLOOR/4π (never up).

    Raises:
        ValueError: L < 1 or amplitude < 0.
    """
    if L < 1:
        raise ValueError(f"the noise needs degrees 1..L with L >= 1, got L = {L}")
    if not amplitude >= 0:
        raise ValueError(f"the noise amplitude must be >= 0, got {amplitude}")
    z = np.random.default_rng(seed).standard_normal((L + 1) ** 2 - 1)
    a = amplitude / (4 * math.pi) * math.sqrt(4 * math.pi / ((L + 1) ** 2 - 1)) * z
    lm = [(ll, m) for ll in range(1, L + 1) for m in range(-ll, ll + 1)]
    modes = [[ll, m, float(v)] for (ll, m), v in zip(lm, a, strict=True)]
    u = 1.0 / (4 * math.pi)
    floor = (NOISE_FLOOR - 1.0) * u
    # Unsöld: |Σ_m a_ℓm Y_ℓm| ≤ |a_ℓ| √((2ℓ+1)/4π); below the floor's room no minimum is needed
    sup = sum(math.sqrt(float(np.sum(a[ll * ll - 1:(ll + 1) ** 2 - 1] ** 2)) * (2 * ll + 1) / (4 * math.pi))
              for ll in range(1, L + 1))
    low = -sup if sup <= -floor else modes_minimum(modes) - u  # the perturbation's minimum (≤ 0: mean 0)
    if low < floor:
        s = floor / low
        modes = [[ll, m, v * s] for ll, m, v in modes]
    return modes


def product_quadrature(N: int) -> tuple[Array, Array]:
    """(nodes (2N², 3) unit vectors, weights (2N²,) summing to 4π) of the product rule.

    N Gauss–Legendre nodes in cos ϑ × 2N uniform longitudes (offset by half a step); exact for spherical
    polynomials of degree ≤ 2N − 1.

    Raises:
        ValueError: N < 1.
    """
    if N < 1:
        raise ValueError(f"the quadrature needs N >= 1, got {N}")
    t, wt = np.polynomial.legendre.leggauss(N)
    phi = (np.arange(2 * N) + 0.5) * math.pi / N
    s = np.sqrt(1.0 - t * t)
    x = np.stack([np.outer(s, np.cos(phi)), np.outer(s, np.sin(phi)), np.outer(t, np.ones(2 * N))], axis=-1)
    w = np.outer(wt, np.full(2 * N, math.pi / N))
    return x.reshape(-1, 3), w.ravel()
