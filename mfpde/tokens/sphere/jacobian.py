"""The exact Jacobian of the particle velocity on S² by the direct sum: what the flow solver's stiff phase takes.

The flow solver (:mod:`~mfpde.tokens.sphere.flow`) integrates X ∈ R^{3n} with V_i(X) = v[Σ_k m_k δ_{x_k}](x_i),
x_i = X_i/|X_i|, where (one Dirac head (β, c))

    v_i = c P_i g_i,   g_i = Σ_k W_ik x_k,   W_ik = m_k e^{β x_i·x_k} / Z_i,   P_i = I − x_i x_iᵀ,

Z_i = Σ_k m_k e^{β x_i·x_k} (SA) or 1 (USA). With Q_k = ∂x_k/∂X_k = P_k/|X_k| its 3 × 3 blocks are, exactly,

    ∂V_i/∂X_k = c P_i W_ik (I + β (x_k − ḡ_i) x_iᵀ) Q_k                             (every k, i included),
    ∂V_i/∂X_i += c (β P_i (Σ_k W_ik x_k x_kᵀ − g_i ḡ_iᵀ) − (x_i·g_i) I − x_i g_iᵀ) Q_i   (through x_i as target),

ḡ_i = g_i (SA: the derivative of the quotient) or 0 (USA). The cost is O(n²) (a few passes over the n × n kernel
matrix and the (3n)² Jacobian itself), the memory that of the dense Jacobian, 72 n² bytes. For the harmonic or
tilted kernel this is the Jacobian of the same velocity up to the kernel's own truncation (its Bessel tail,
≤ 1e-14 relative, or the tilted kernel's 1e-6): the stiff integrator uses it in its Newton iteration only, whose
converged solution does not depend on it, and it costs less than the O(n² (L+1)²) of the series' own Jacobian
(and far less than the 3n velocity evaluations of a finite-difference one). Measured at USA β = 20 (harmonic
kernel, L = 39), n = 128, 512, 2048: 5 ms, 0.19 s, 3 s a Jacobian, against 3n evaluations of the series at 3.4, 9,
23 ms each (1.3 s, 14 s, 140 s).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from mfpde.tokens.sphere.theory import ATTENTIONS

__all__ = ["attention_heads", "attention_jacobian"]

Array = npt.NDArray[np.float64]


def attention_jacobian(X: Array, m: Array, heads: Sequence[tuple[float, str, float]]) -> Array:
    """∂V/∂X (3n, 3n) of the particle velocity V_i(X) = v(X_i/|X_i|) of the masses m, summed over the heads.

    Args:
        X: the particles (n, 3), any nonzero radius (the velocity is that of the unit vectors X_i/|X_i|).
        m: their masses (n,).
        heads: (β, attention, c) per head: β > 0, attention "softmax" or "unnormalised", c the head's weight.

    Returns:
        J with J[3i + a, 3k + b] = ∂V_{i,a}/∂X_{k,b}, shape (3n, 3n).

    Raises:
        ValueError: an unknown attention.
    """
    X = np.asarray(X, dtype=float).reshape(-1, 3)
    m = np.asarray(m, dtype=float).ravel()
    n = len(X)
    r = np.linalg.norm(X, axis=1)
    x = X / r[:, None]
    eye = np.eye(3)
    P = eye - x[:, :, None] * x[:, None, :]  # (n, 3, 3), P_i
    G = x @ x.T  # x_i·x_k
    # the blocks entry by entry, (n, n) arrays: with Q_k = P_k/r_k, P_i Q_k = (I − x_i x_iᵀ − x_k x_kᵀ
    # + G_ik x_i x_kᵀ)/r_k and x_iᵀ Q_k = (x_i − G_ik x_k)ᵀ/r_k
    J = np.zeros((3, 3, n, n))  # J[a, b, i, k] = ∂V_{i,a}/∂X_{k,b}
    q = [x[:, None, b] - G * x[None, :, b] for b in range(3)]
    diag = np.zeros((n, 3, 3))
    for beta, attention, c in heads:
        if attention not in ATTENTIONS:
            raise ValueError(f"attention must be one of {ATTENTIONS}, got {attention!r}")
        e = beta * G
        if attention == "softmax":
            e -= e.max(axis=1, keepdims=True)
        W = np.exp(e) * m  # (n, n)
        if attention == "softmax":
            W /= W.sum(axis=1, keepdims=True)
        g = W @ x  # (n, 3)
        gbar = g if attention == "softmax" else np.zeros_like(g)
        s = np.einsum("ia,ia->i", x, gbar)
        Wr = (c / r)[None, :] * W
        # P_i (x_k − ḡ_i), component a: x_ka − ḡ_ia − x_ia (G_ik − s_i)
        p = [x[None, :, a] - gbar[:, None, a] - x[:, None, a] * (G - s[:, None]) for a in range(3)]
        for a in range(3):
            for b in range(3):
                PQ = (float(a == b) - x[:, None, a] * x[:, None, b] - x[None, :, a] * x[None, :, b]
                      + G * x[:, None, a] * x[None, :, b])
                J[a, b] += Wr * (PQ + beta * p[a] * q[b])
        second = np.einsum("ik,ka,kb->iab", W, x, x) - g[:, :, None] * gbar[:, None, :]
        diag += c * (beta * P @ second - np.einsum("ia,ia->i", x, g)[:, None, None] * eye
                     - x[:, :, None] * g[:, None, :])
    idx = np.arange(n)
    J[:, :, idx, idx] += np.moveaxis(diag @ (P / r[:, None, None]), 0, -1)
    return np.ascontiguousarray(J.transpose(2, 0, 3, 1)).reshape(3 * n, 3 * n)


def attention_heads(velocity: Any) -> list[tuple[float, str, float]] | None:
    """The heads (β, attention, c) of an attention velocity (one kernel or a sum of kernels' ``parts``).

    None for a velocity that is not attention (a prescribed rotation, a test's field): its Jacobian is not this
    one, and the stiff integrator takes finite differences instead.
    """
    parts = getattr(velocity, "parts", [velocity])
    heads = []
    for p in parts:
        beta, attention, c = (getattr(p, k, None) for k in ("beta", "attention", "c"))
        if not isinstance(beta, float | int) or attention not in ATTENTIONS or not isinstance(c, float | int):
            return None
        heads.append((float(beta), str(attention), float(c)))
    return heads
