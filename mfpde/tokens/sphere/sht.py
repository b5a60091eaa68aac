"""The sphere's harmonic transforms at points, by ducc0 where it is installed (optional), else by numpy.

:func:`analysis` (the adjoint synthesis Σ_j w_j Y_ℓm(x_j)) and :func:`synthesis` (Σ g_ℓm Y_ℓm(x) and its surface
gradient) take the arguments of their :mod:`~mfpde.tokens.sphere.harmonics` namesakes and agree with them to
round-off. With ``pip install mfpde[ducc]`` (ducc0, GPL-2.0-or-later, an optional extra) they call
``ducc0.sht.experimental.synthesis_general`` / ``adjoint_synthesis_general`` (a Legendre transform to a grid,
then a non-uniform FFT: O(L³ + n) per transform instead of O(n L²); 4–60× faster at L = 16..55 and 2·10⁴
points); without it, or with the environment variable ``MFPDE_SHT=numpy``, the numpy recurrences of
:mod:`~mfpde.tokens.sphere.harmonics` (the reference). ``MFPDE_SHT=ducc0`` insists on ducc0 (an ImportError
without it). ducc0 runs ``MFPDE_SHT_THREADS`` threads (default 1: the ranks of MPI are the parallelism).

Conventions. mfpde's real orthonormal Y_ℓm (:mod:`~mfpde.tokens.sphere.harmonics`: Condon–Shortley phase,
Y_ℓ,±m = √2 (−1)^m Re/Im Y_ℓ^m) against ducc0's complex a_ℓm of a real map f = Σ_ℓ a_ℓ0 Y_ℓ^0 + 2 Σ_{m>0}
Re(a_ℓm Y_ℓ^m) (healpy's layout: index m(2L+1−m)/2 + ℓ, m = 0..L, the same Condon–Shortley phase):

    a_ℓ0 = g_ℓ0,   a_ℓm = (−1)^m (g_ℓm − i g_ℓ,−m)/√2   (m > 0),

(:func:`to_ducc`) and its inverse g_ℓm = √2 (−1)^m Re a_ℓm, g_ℓ,−m = −√2 (−1)^m Im a_ℓm (:func:`from_ducc`).
ducc0's adjoint returns Σ_j w_j conj Y_ℓ^m(x_j), which :func:`from_ducc` maps to Σ_j w_j Y_ℓ,±m(x_j) as well. The
surface gradient is ducc0's spin-1 "DERIV1" synthesis (∂_ϑ f, ∂_φ f / sin ϑ) in the frame e_ϑ, e_φ.

Accuracy: ducc0 is asked for :data:`EPSILON` = 1e-14 (the smallest its double kernels accept); measured at
L = 1..55, the error is below 1e-15 Σ|g| (the numpy path's round-off is of the same order), so the kernels'
round-off bounds (:func:`~mfpde.tokens.sphere.kernel.choose_kernel`) hold for both. Below :data:`MIN_POINTS`
points (where the FFT's set-up dominates) the numpy path runs whatever the backend.
"""

from __future__ import annotations

from functools import lru_cache
from types import ModuleType

import numpy as np
import numpy.typing as npt

from mfpde.environment import sht_choice, sht_threads
from mfpde.tokens.sphere import harmonics

__all__ = ["BACKENDS", "ENV", "EPSILON", "MIN_POINTS", "analysis", "backend", "from_ducc", "synthesis", "to_ducc"]

Array = npt.NDArray[np.float64]

#: the backends: ducc0 (optional) and numpy (the reference)
BACKENDS = ("ducc0", "numpy")
#: the environment variable that picks the backend ("numpy", "ducc0"; unset or "auto": ducc0 if importable)
ENV = "MFPDE_SHT"
#: ducc0's requested accuracy (relative to the map's size; the smallest value its double-precision kernels accept)
EPSILON = 1e-14
#: fewer points than this take the numpy path (as fast there: the NUFFT's fixed cost O(L² log L) dominates)
MIN_POINTS = 16


def _ducc0() -> ModuleType | None:
    try:
        import ducc0
    except ImportError:
        return None
    return ducc0


def backend() -> str:
    """The backend the transforms use now: "ducc0" if importable and ``MFPDE_SHT`` is not "numpy", else "numpy".

    ``MFPDE_SHT`` is read by :func:`mfpde.environment.sht_choice` (the commands check it at their start).

    Raises:
        ConfigError: ``MFPDE_SHT`` is none of "", "auto", "numpy", "ducc0", or "ducc0" without ducc0 installed.
    """
    choice = sht_choice()
    if choice == "numpy" or _ducc0() is None:
        return "numpy"
    return "ducc0"


def _threads() -> int:
    return sht_threads()


@lru_cache(maxsize=16)
def _layout(L: int) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp], Array]:
    """For ducc0's index j of (ℓ, m): the real columns ℓ²+ℓ+m and ℓ²+ℓ−m, and the factor (−1)^m/√2 (1 at m = 0)."""
    ll = np.concatenate([np.arange(m, L + 1) for m in range(L + 1)])
    mm = np.concatenate([np.full(L + 1 - m, m) for m in range(L + 1)])
    s = np.where(mm == 0, 1.0, np.where(mm % 2 == 0, 1.0, -1.0) / np.sqrt(2.0))
    return ll * ll + ll + mm, ll * ll + ll - mm, s


def to_ducc(L: int, g: npt.ArrayLike) -> npt.NDArray[np.complex128]:
    """ducc0's a_ℓm (..., (L+1)(L+2)/2) of the real series g (..., (L+1)²) (index ℓ² + ℓ + m; see the module)."""
    kp, km, s = _layout(L)
    g = np.asarray(g, dtype=float)
    im = np.where(kp == km, 0.0, g[..., km])
    return np.asarray(s * (g[..., kp] - 1j * im), dtype=np.complex128)


def from_ducc(L: int, a: npt.ArrayLike) -> Array:
    """The real series g (..., (L+1)²) of ducc0's a_ℓm (..., (L+1)(L+2)/2): the inverse of :func:`to_ducc`."""
    kp, km, s = _layout(L)
    a = np.asarray(a, dtype=np.complex128)
    g = np.empty((*a.shape[:-1], (L + 1) ** 2))
    pos = kp != km
    g[..., km[pos]] = -a.imag[..., pos] / s[pos]
    g[..., kp] = a.real / s  # m = 0 last: its column kp = km
    return g


def _loc(x: npt.ArrayLike) -> tuple[Array, Array, Array]:
    """(ducc0's loc (n, 2) = (ϑ, φ), e_ϑ (n, 3), e_φ (n, 3)) of the points x (n, 3) (any nonzero length)."""
    x = np.asarray(x, dtype=float).reshape(-1, 3)
    rho = np.hypot(x[:, 0], x[:, 1])
    theta = np.arctan2(rho, x[:, 2])
    phi = np.arctan2(x[:, 1], x[:, 0])
    phi = np.where(phi < 0, phi + 2 * np.pi, phi)
    ct, st, cp, sp = np.cos(theta), np.sin(theta), np.cos(phi), np.sin(phi)
    e_theta = np.stack([ct * cp, ct * sp, -st], axis=1)
    e_phi = np.stack([-sp, cp, np.zeros_like(sp)], axis=1)
    return np.ascontiguousarray(np.stack([theta, phi], axis=1)), e_theta, e_phi


def analysis(L: int, x: npt.ArrayLike, w: npt.ArrayLike) -> Array:
    """Σ_j w_j Y_ℓm(x_j) for ℓ ≤ L at the points x (n, 3): as :func:`~mfpde.tokens.sphere.harmonics.analysis`.

    Shape ((L+1)²,) for w (n,), (k, (L+1)²) for k sets of weights w (k, n). Raises ValueError for L < 0.
    """
    if L < 0:
        raise ValueError(f"L must be >= 0, got {L}")
    x = np.asarray(x, dtype=float).reshape(-1, 3)
    if len(x) < MIN_POINTS or backend() == "numpy":
        return harmonics.analysis(L, x, w)
    ducc0 = _ducc0()
    assert ducc0 is not None
    w = np.asarray(w, dtype=float)
    ws = w.reshape(-1, len(x))
    loc = _loc(x)[0]
    out = np.empty((len(ws), (L + 1) ** 2))
    for i, wi in enumerate(ws):
        a = ducc0.sht.experimental.adjoint_synthesis_general(
            map=np.ascontiguousarray(wi)[None], spin=0, lmax=L, loc=loc, epsilon=EPSILON, nthreads=_threads())
        out[i] = from_ducc(L, a[0])
    return out[0] if w.ndim == 1 else out


def synthesis(L: int, g: npt.ArrayLike, x: npt.ArrayLike, gradient: bool = False) -> tuple[Array, Array | None]:
    """Σ_k g_k Y_k at the points x (m, 3) (shape (m,)) and, if asked, its surface gradient (m, 3).

    As :func:`~mfpde.tokens.sphere.harmonics.synthesis`: g of shape ((L+1)²,), index ℓ² + ℓ + m.
    Raises ValueError for L < 0.
    """
    if L < 0:
        raise ValueError(f"L must be >= 0, got {L}")
    x = np.asarray(x, dtype=float).reshape(-1, 3)
    g = np.asarray(g, dtype=float)
    if len(x) < MIN_POINTS or backend() == "numpy":
        return harmonics.synthesis(L, g, x, gradient)
    ducc0 = _ducc0()
    assert ducc0 is not None
    loc, e_theta, e_phi = _loc(x)
    a = to_ducc(L, g)[None]
    f = ducc0.sht.experimental.synthesis_general(alm=a, spin=0, lmax=L, loc=loc, epsilon=EPSILON,
                                                 nthreads=_threads())[0]
    if not gradient:
        return f, None
    if L == 0:
        return f, np.zeros((len(x), 3))
    d = ducc0.sht.experimental.synthesis_general(alm=a, spin=1, lmax=L, loc=loc, epsilon=EPSILON,
                                                 nthreads=_threads(), mode="DERIV1")
    return f, d[0][:, None] * e_theta + d[1][:, None] * e_phi
