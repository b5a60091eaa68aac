# # Gaussian tokens through attention: the McKean–Vlasov transport against its closed form
#
# This demo illustrates how to
# - build a token mesh, a DG token space and the token solver of mfpde,
# - describe a head distribution ρ by finitely many weighted heads θ = (a, v),
# - transport a Gaussian token measure through depth and compare with the exact Gaussian solution,
# - write μ_t for ParaView.
#
# The token density solves the continuity equation with the softmax-attention velocity (theory §1.3)
#
# $$\partial_t \mu_t + \nabla\cdot(\mu_t V[\mu_t;\rho]) = 0,\qquad
#   V[\mu;\rho](x) = \int v \,\frac{\int y\, e^{a x y}\, d\mu(y)}{\int e^{a x y}\, d\mu(y)}\, d\rho(a, v),$$
#
# and for μ_0 = N(m_0, σ_0²) it stays Gaussian (theory §6.1) with
# $\sigma_t^2 = \sigma_0^2/(1 - 2\bar b\sigma_0^2 t)$, $m_t = m_0 e^{\bar a t}(1 - 2\bar b\sigma_0^2 t)^{-1/2}$,
# $\bar a = \int v\, d\rho$, $\bar b = \int a v\, d\rho$.
#
# Run: `mpiexec -n 2 python3 demos/demo_gaussian_transport.py` (add `--quick` for a coarse check).

# ## Parameters

# +
import sys
from pathlib import Path

from mpi4py import MPI

import dolfinx.fem
import dolfinx.io
import numpy as np

from mfpde.exact import gaussian_transport
from mfpde.mesh import box
from mfpde.params.family import ScalarHeads
from mfpde.params.theta import dirac_heads
from mfpde.tokens.readout import readout_function
from mfpde.tokens.transport import TokenTransport

quick = "--quick" in sys.argv
cells = 100 if quick else 400
m0, s0, T = 0.3, 0.25, 1.0
heads = dirac_heads(ScalarHeads(), points=[[-0.5, 1.0], [0.3, 0.5]], weights=[0.5, 0.5])
out = Path("out_demo_gaussian_transport")
# -

# ## Mesh and space
# An interval [-4, 4] with `cells` cells, distributed over the MPI ranks; DG of degree 1.

domain = box(MPI.COMM_WORLD, [[-4.0, 4.0]], [cells])
solver = TokenTransport(domain, degree=1)

# ## Initial data
# The Gaussian density, interpolated and renormalised to mass 1.

mu = dolfinx.fem.Function(solver.W, name="mu")
mu.interpolate(lambda x: np.exp(-((x[0] - m0) ** 2) / (2 * s0)))
mu.x.array[:] /= solver.mass(mu)

# ## Depth loop, with output every 10 steps

# +
with dolfinx.io.VTXWriter(MPI.COMM_WORLD, out / "mu.bp", [mu]) as writer:
    writer.write(0.0)
    rep = solver.solve(mu, heads, T, cells // 4, readout_function("mean"),
                       callback=lambda k, t, u: writer.write(t) if k % 10 == 0 else None)
# -

# ## Compare with the closed form

m_T, S_T = gaussian_transport(m0, s0, heads.abar, heads.bbar, T)
m_exact, s_exact = m_T[0], S_T[0, 0]
if MPI.COMM_WORLD.rank == 0:
    print(f"mean     {rep.mean_T[0]:.6f}  exact {m_exact:.6f}")
    print(f"variance {rep.cov_T[0][0]:.6f}  exact {s_exact:.6f}")
    print(f"mass error {rep.mass_error:.2e}, outflow {rep.outflow:.2e}, min density {rep.min_density:.2e}")
assert abs(rep.mean_T[0] - m_exact) < 1e-2 and abs(rep.cov_T[0][0] - s_exact) < 1e-2
