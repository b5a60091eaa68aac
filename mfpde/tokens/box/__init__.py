"""Tokens in a box Ω ⊂ R^d (d = 1, 2) or on a mesh of one: the domain of the training problem (theory §1–§3).

* :mod:`~mfpde.tokens.box.velocity`: V[μ; ρ] on the mesh and its vector–Jacobian product, one class;
  :mod:`~mfpde.tokens.box.quadrature`: the gathered lumped-mass quadrature of a DG density;
  :mod:`~mfpde.tokens.box.separable`, :mod:`~mfpde.tokens.box.chebyshev`, :mod:`~mfpde.tokens.box.interpolated`,
  :mod:`~mfpde.tokens.box.substitution`: the fast kernels of tensor grids and smooth heads.
* :mod:`~mfpde.tokens.box.transport`: upwind DG / SSP-RK3 in depth with a typed tape (§1.3 (F));
  :mod:`~mfpde.tokens.box.upwind`: the DG0 facet arrays; :mod:`~mfpde.tokens.box.batch`: DG0 for a batch of samples;
  :mod:`~mfpde.tokens.box.shallow`: the single residual layer (§2); :mod:`~mfpde.tokens.box.adjoint`,
  :mod:`~mfpde.tokens.box.tape`: the discrete adjoint through the tape (§3).
* :mod:`~mfpde.tokens.box.readout`, :mod:`~mfpde.tokens.box.data`, :mod:`~mfpde.tokens.box.particles`: g, μ_0^i,
  the particle reference.
* :mod:`~mfpde.tokens.box.job`: the ``transport`` command on the box; :mod:`~mfpde.tokens.box.config`: its config
  rules.
"""
