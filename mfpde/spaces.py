"""Function-space helpers shared by the token and parameter solvers."""

from __future__ import annotations

import dolfinx.fem
import dolfinx.la
import numpy as np
import numpy.typing as npt
import ufl


def lumped_mass(V: dolfinx.fem.FunctionSpace) -> npt.NDArray[np.float64]:
    """The lumped mass m_i = ∫ φ_i dx of every local dof (owned and ghost), shape (n_local,).

    For P1/Q1 (and DG of degree ≤ 1) Σ_i m_i u_i = ∫ u_h exactly, and Σ_i m_i f(x_i) u_i is the
    vertex (trapezoidal) rule: positive weights, second order.
    """
    w = ufl.TestFunction(V)
    m = dolfinx.fem.Function(V)
    dolfinx.fem.assemble_vector(m.x.array, dolfinx.fem.form(w * ufl.dx))
    m.x.scatter_reverse(dolfinx.la.InsertMode.add)
    m.x.scatter_forward()
    return np.array(m.x.array, dtype=np.float64)
