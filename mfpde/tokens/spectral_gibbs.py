"""The Gibbs map of a spectral discretisation of noisy tokens' stationary states, and its exact Jacobian.

The circle's cosines and the sphere's Legendre polynomials share it (:mod:`mfpde.tokens.circle.spectral`,
:mod:`mfpde.tokens.sphere.spectral`): the unknowns c are the coefficients of μ in a basis where the kernel is
diagonal (eigenvalues λ), the Gibbs density at quadrature points is p(c) = e^{κ VΛc}/∫e^{κ VΛc} (κ = K/(τβ), V the
basis at the points), and the stationary equation is F(c, K) = c − A p(c) = 0 (A: the points' values to the
coefficients). ∂F/∂c = I − κ A (diag p − p (q p)ᵀ) VΛ, ∂F/∂K = −A (diag p − p (q p)ᵀ) VΛ c/(τβ) (q: the quadrature
weights of ∫).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["SpectralGibbs"]

Array = npt.NDArray[np.float64]


class SpectralGibbs:
    """Residual and exact Jacobian of c = A p(c) (module docstring); the last point's kept for the next request.

    A subclass calls :meth:`_gibbs_setup` with VΛ (values × eigenvalues), A and q once it has them.
    """

    noise: float
    beta: float

    def _gibbs_setup(self, VL: Array, A: Array, q: Array) -> None:
        self._VL, self._A, self._q = VL, A, q
        self._eye = np.eye(A.shape[0])
        self._last_gibbs: tuple[float, Array, Array, float] | None = None
        self._last_jacobian: tuple[float, Array, Array, Array] | None = None

    def _gibbs(self, c: Array, K: float) -> tuple[Array, float]:
        """(p(c) at the quadrature points, κ), not to be written.

        The last point's is kept: Newton's residual and Jacobian, det ∂F/∂c and the tangent ask for the same point.
        """
        last = self._last_gibbs
        if last is not None and last[0] == K and np.array_equal(last[1], c):
            return last[2], last[3]
        p, kappa = self._gibbs_at(c, K)
        self._last_gibbs = (K, np.array(c, dtype=float), p, kappa)
        return p, kappa

    def _gibbs_at(self, c: Array, K: float) -> tuple[Array, float]:
        kappa = K / (self.noise * self.beta)
        g = kappa * (self._VL @ c)
        p = np.exp(g - g.max())
        return p / float(self._q @ p), kappa

    def residual(self, u: Array, K: float) -> Array:
        """F(c, K) = c − A p(c), shape (m,)."""
        return np.asarray(u, float) - self._A @ self._gibbs(u, K)[0]  # a failed trial: non-finite, rejected

    def jacobian(self, u: Array, K: float) -> tuple[Array, Array]:
        """(∂F/∂c (m, m), ∂F/∂K (m,)), exact (module docstring)."""
        last = self._last_jacobian  # the same point's, asked in turn by det ∂F/∂c and the tangent (not to be written)
        if last is not None and last[0] == K and np.array_equal(last[1], u):
            return last[2], last[3]
        p, kappa = self._gibbs(u, K)
        SB = p[:, None] * self._VL - np.outer(p, (self._q * p) @ self._VL)
        ASB = self._A @ SB
        Ju, JK = self._eye - kappa * ASB, -(ASB @ u) / (self.noise * self.beta)
        self._last_jacobian = (K, np.array(u, dtype=float), Ju, JK)
        return Ju, JK
