# # Gaussian tokens through attention: the McKean–Vlasov transport against its closed form
#
# This demo illustrates how to
# - build a token mesh, a DG token space and the token solver of mfpde,
# - describe a head distribution ρ by finitely many weighted heads θ = (a, v),
# - transport a Gaussian token measure through depth and compare with the exact Gaussian solution,
# - measure the order of the scheme under mesh refinement, and write μ_t for ParaView.
#
# The token density solves the continuity equation with the softmax-attention velocity (theory §1.3)
#
# $$\partial_t \mu_t + \nabla\cdot(\mu_t V[\mu_t;\rho]) = 0,\qquad
#   V[\mu;\rho](x) = \int v \,\frac{\int y\, e^{a x y}\, d\mu(y)}{\int e^{a x y}\, d\mu(y)}\, d\rho(a, v),$$
#
# and for μ_0 = N(m_0, σ_0²) it stays Gaussian (theory §6.1) with
# $$\sigma_t^2 = \frac{\sigma_0^2}{1 - 2\bar b\sigma_0^2 t},\qquad
#   m_t = m_0 e^{\bar a t}(1 - 2\bar b\sigma_0^2 t)^{-1/2},\qquad
#   \bar a = \int v\, d\rho,\quad \bar b = \int a v\, d\rho.$$
#
# The DG1 scheme (upwind fluxes, SSP-RK3 in depth with Δt ∝ h) is second order, so the error of the
# moments falls like h² (theory §7 item 2): the demo fits the order and fails if it is not 2 ± 0.25.
#
# Run: `mpiexec -n 2 python3 demos/demo_gaussian_transport.py` (add `--quick`, or set `MFPDE_DEMO_QUICK=1`,
# for the coarse meshes of the test suite). Output: `out_demo_gaussian_transport/` (`mu.bp`, `gaussian.png`).

# ## Parameters

# +
import os
import sys
from pathlib import Path

from mpi4py import MPI

import dolfinx.fem
import dolfinx.io
import numpy as np

from mfpde.exact import gaussian_transport
from mfpde.fitting import fit_order
from mfpde.heads import dirac_heads
from mfpde.mesh import box
from mfpde.params.family import ScalarHeads
from mfpde.tokens.box.readout import readout_function
from mfpde.tokens.box.transport import TokenTransport

quick = "--quick" in sys.argv or os.environ.get("MFPDE_DEMO_QUICK") == "1"
comm = MPI.COMM_WORLD
cells = [50, 100, 200] if quick else [100, 200, 400, 800]
m0, s0, T = 0.3, 0.25, 1.0
heads = dirac_heads(ScalarHeads(), points=[[-0.5, 1.0], [0.3, 0.5]], weights=[0.5, 0.5])
out = Path("out_demo_gaussian_transport")
# -

# The closed form (mfpde.exact, theory §6.1), with ā = 0.75 and b̄ = −0.175 (a contracting ρ):

m_exact, S_exact = gaussian_transport(m0, s0, heads.abar, heads.bbar, T)
m_exact, s_exact = float(m_exact[0]), float(S_exact[0, 0])

# ## Mesh, space, solver and the depth loop, once per mesh
# An interval [−4, 4] with `n` cells, distributed over the MPI ranks; DG of degree 1; `n/4` depth steps,
# sub-cycled for the positivity CFL condition. μ_t of the finest mesh is written every 10 depth steps.


def transport(n: int, writer_path: Path | None = None):
    solver = TokenTransport(box(comm, [[-4.0, 4.0]], [n]), degree=1)
    mu = dolfinx.fem.Function(solver.W, name="mu")
    mu.interpolate(lambda x: np.exp(-((x[0] - m0) ** 2) / (2 * s0)))
    mu.x.array[:] /= solver.mass(mu)  # a probability density
    steps = n // 4
    if writer_path is None:
        return solver, mu, solver.solve(mu, heads, T, steps, readout_function("mean"))
    with dolfinx.io.VTXWriter(comm, writer_path, [mu]) as writer:
        writer.write(0.0)
        rep = solver.solve(mu, heads, T, steps, readout_function("mean"),
                           callback=lambda k, t, u: writer.write(t) if k % 10 == 0 or k == steps else None)
    return solver, mu, rep


hs, errors = [], []
for n in cells:
    solver, mu, rep = transport(n, out / "mu.bp" if n == cells[-1] else None)
    hs.append(8.0 / n)
    errors.append(max(abs(rep.mean_T[0] - m_exact), abs(rep.cov_T[0][0] - s_exact)))
    if comm.rank == 0:
        print(f"{n:4d} cells: mean {rep.mean_T[0]:.6f} (exact {m_exact:.6f}), variance {rep.cov_T[0][0]:.6f} "
              f"(exact {s_exact:.6f}), error {errors[-1]:.2e}, mass error {rep.mass_error:.1e}, "
              f"min density {rep.min_density:.1e}")

# ## The order of the scheme
# The slope of log(error) against log(h); DG1 is second order.

order = float(fit_order(hs, errors))
if comm.rank == 0:
    print(f"fitted order {order:.3f} (expected 2)")

# ## Output: μ_T against the exact Gaussian, and the error against h
# The density at the nodes of the finest mesh: node masses (lumped quadrature, gathered on every rank)
# divided by the lumped mass of the node.

# +
one = dolfinx.fem.Function(solver.W)
one.x.array[:] = 1.0
x, w, m = solver.quad.points[:, 0], solver.quad.gather(mu), solver.quad.gather(one)
if comm.rank == 0:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    order_x = np.argsort(x)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    xs = np.linspace(-4, 4, 400)
    ax1.plot(xs, np.exp(-((xs - m0) ** 2) / (2 * s0)) / np.sqrt(2 * np.pi * s0), "k:", label=r"$\mu_0$")
    ax1.plot(x[order_x], (w / m)[order_x], label=rf"$\mu_T$, DG1, {cells[-1]} cells")
    ax1.plot(xs, np.exp(-((xs - m_exact) ** 2) / (2 * s_exact)) / np.sqrt(2 * np.pi * s_exact), "--",
             label=r"$N(m_T, \sigma_T^2)$ (theory §6.1)")
    ax1.set(xlabel="token x", ylabel="density", title="Gaussian tokens at depth T = 1")
    ax1.legend()
    ax2.loglog(hs, errors, "o-", label=f"max(|m_T error|, |σ_T² error|), fitted order {order:.2f}")
    ax2.loglog(hs, errors[-1] * (np.array(hs) / hs[-1]) ** 2, "k--", label="order 2")
    ax2.set(xlabel="cell size h", ylabel="error against the closed form", title="convergence")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(out / "gaussian.png", dpi=120)
    plt.close(fig)
# -

# The check the test suite relies on: the scheme's order (theory §7 item 2: "relative error → 0 at the
# scheme's order"), with the tolerance of `mfpde verify`'s `gaussian_exact_d1`.

assert abs(order - 2.0) < 0.25, f"fitted order {order:.3f}, expected 2 ± 0.25 (errors {errors})"
