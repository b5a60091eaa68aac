"""The token side: attention kernels, the transport solver, the shallow layer, the discrete adjoint, data.

* :mod:`~mfpde.tokens.attention`: softmax kernels and their vector–Jacobian products (pure numpy, §1.2).
* :mod:`~mfpde.tokens.quadrature`: the gathered lumped-mass quadrature of a DG density.
* :mod:`~mfpde.tokens.velocity`: V[μ; ρ] on the mesh and its vector–Jacobian product, one class.
* :mod:`~mfpde.tokens.transport`: upwind DG / SSP-RK3 in depth with a typed tape (§1.3 (F)).
* :mod:`~mfpde.tokens.shallow`: the single residual layer, its own forward map (§2).
* :mod:`~mfpde.tokens.adjoint`: the discrete adjoint through the tape (§3).
* :mod:`~mfpde.tokens.readout`, :mod:`~mfpde.tokens.data`, :mod:`~mfpde.tokens.particles`: g, μ_0^i, the
  particle reference; :mod:`~mfpde.tokens.job`: the ``transport`` command.
"""
