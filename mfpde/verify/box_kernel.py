"""The gather-free token velocity on the box against the direct log-domain sums over all of μ (theory §1.3 (F)).

``box_kernel_reduced``: on the ranks verify runs on, the velocity that a cluster job's plain updates take
(:mod:`mfpde.tokens.box.reduced`: each rank sums its own quadrature points against the Chebyshev nodes of the
mesh's bounding box, one reduction, each rank interpolates at its vertices) is forced on and compared, at every
vertex of every rank, with the direct sums of :func:`~mfpde.tokens.attention.softmax_moments_direct` over the
gathered μ, written apart from the reduced path. Cases: d = 1 DG0 and DG1 on intervals, d = 2 DG0 on a square
grid and DG1 on triangles, five heads a ∈ [−2, 2] of both signs. The bound per head |c_k| max|y| times: the
series' tail 8 d · 1e-14 (the stopping rule: the last three coefficients below 1e-14 max|y| per direction,
geometric decay after them) plus the softmax round-off of the grid values (P. Blanchard, D. J. Higham and N. J.
Higham, IMA J. Numer. Anal. 41 (2021) 2311, §3–4: η = 2E γ_{d+3} + γ_{N+2}, E the largest exponent) carried by the
Lebesgue constant Λ_n^d ≤ ((2/π) log(n + 1) + 1)^d of the largest degree tried (Trefethen, ATAP Thm 15.2), and
the direct sums' own round-off once more. A reduction dropped or a shift from the wrong extreme moves the
velocity by far more on more than one rank; on one rank the reductions are identities, so this check speaks for
the parallel path only under ``mpiexec -n 2`` or more.
"""

from __future__ import annotations

import math

from mpi4py import MPI

import numpy as np

from mfpde.verify.conservation import gamma
from mfpde.verify.registry import Outcome, register

__all__ = ["check_box_kernel_reduced"]

#: The stopping rule's tail tolerance of the reduced paths (their default).
TOL = 1e-14
#: (d, cells, cell type, DG degree); quick: the first and the last.
CASES = ((1, [400], "quadrilateral", 0), (1, [300], "quadrilateral", 1), (2, [40, 40], "quadrilateral", 0),
         (2, [24, 24], "triangle", 1))


def _lebesgue(n: int) -> float:
    return 2 / math.pi * math.log(n + 1) + 1


def _bound(x: np.ndarray, y: np.ndarray, w: np.ndarray, a: np.ndarray, c: np.ndarray, d: int) -> float:
    """The bound of the module docstring at the vertices x for μ = (y, w) and heads (a, c)."""
    sup = w > 0
    E = float(np.abs(a).max()) * float(np.max(np.abs(x @ y[sup].T))) * 2 + float(np.max(np.abs(np.log(w[sup]))))
    n = int(sup.sum())
    eta = 2 * (2.0 * E * gamma(d + 3) + gamma(n + 2)) + gamma(n)
    return float(np.abs(c).sum()) * (8 * d * TOL + (_lebesgue(64 if d == 2 else 512) ** d + 1) * eta) * float(
        np.abs(y).max())


@register("box_kernel_reduced", "§1.3 (F) (the token velocity)",
          "the direct log-domain sums over the gathered μ", kind="ratio to bound")
def check_box_kernel_reduced(quick: bool) -> Outcome:
    """The worst |V_reduced − V_direct| / bound over the cases, the vertices and the ranks: ≤ 1."""
    import dolfinx.fem

    from mfpde.heads import HeadMeasure
    from mfpde.mesh import box
    from mfpde.tokens.attention import softmax_moments_direct
    from mfpde.tokens.box.transport import TokenTransport

    comm = MPI.COMM_WORLD
    heads = HeadMeasure(np.linspace(-2.0, 2.0, 5), np.array([0.1, -0.3, 0.2, 0.25, -0.15]))
    worst, lines, reached = 0.0, [], True
    for d, cells, cell, degree in (CASES[0], CASES[-1]) if quick else CASES:
        tt = TokenTransport(box(comm, [[-1.5, 1.5]] * d, cells, cell), degree=degree)
        u = dolfinx.fem.Function(tt.W)
        u.interpolate(lambda x: np.exp(-((x[0] - 0.3) ** 2 + (x[1] + 0.2) ** 2) / 0.3) + 0.05)
        v = tt.velocity
        wts = tt.quad.gather(u)  # the reference's μ
        ref = sum(ck * softmax_moments_direct(v.x, tt.quad.points, wts, ak)[1]
                  for ak, ck in zip(heads.a, heads.c, strict=True))
        v.gather_free = True
        v.update(u, heads)
        reached = reached and bool(comm.allreduce(v.path == "reduced", op=MPI.LAND))
        err = float(np.abs(v.field.x.array.reshape(-1, d) - ref).max(initial=0.0))
        bound = _bound(v.x, tt.quad.points, wts, heads.a, heads.c, d)
        ratio = comm.allreduce(err / bound, op=MPI.MAX)
        emax = comm.allreduce(err, op=MPI.MAX)
        worst = max(worst, ratio)
        lines.append(f"d = {d} {cell} DG{degree} ({v.path}): max|ΔV| {emax:.1e}, {ratio:.2g} of the bound")
    ok = worst <= 1.0 and reached
    detail = (f"{comm.size} rank(s); " + "; ".join(lines)
              + ("" if reached else "; the reduced path was not taken"))
    return Outcome(worst, None, "≤ 1 (the series' tail + the softmax round-off times Λ^d)", ok, detail)
