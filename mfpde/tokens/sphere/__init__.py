"""Tokens on the unit sphere S² (theory §9): layer-normalised tokens in d = 3.

* :mod:`~mfpde.tokens.sphere.theory`: the exact growth rates of the degrees ℓ about the uniform state.
* :mod:`~mfpde.tokens.sphere.velocity`: the velocity protocol every sphere solver takes, the O(n²) direct sum
  (the reference) and the solid-body rotation.
* :mod:`~mfpde.tokens.sphere.harmonics`: real orthonormal spherical harmonics Y_ℓm by stable recurrences, the
  analysis Σ_j w_j Y_ℓm(x_j) and the synthesis of a series with its surface gradient.
* :mod:`~mfpde.tokens.sphere.sht`: the same analysis and synthesis by ducc0 where installed (``mfpde[ducc]``,
  optional, 4–60× faster), else by :mod:`~mfpde.tokens.sphere.harmonics`; ``MFPDE_SHT=numpy`` forces numpy.
* :mod:`~mfpde.tokens.sphere.kernel`: the velocity without a gather (the Funk–Hecke series of K∗μ, one
  Allreduce), the log-domain direct quadrature (the exact reference, gathers) and the rule that picks a kernel.
* :mod:`~mfpde.tokens.sphere.tilted`: the SA kernel past β ≈ 10 without a gather (series about K centres).
* :mod:`~mfpde.tokens.sphere.series`: the Bessel tail of the series, the degree L it sets, the degree power.
* :mod:`~mfpde.tokens.sphere.mesh`: the icosahedral surface mesh (flat or quadratic), built in code.
* :mod:`~mfpde.tokens.sphere.geometry`, :mod:`~mfpde.tokens.sphere.dg`: upwind DG of degree 0..3 (one normal
  velocity per edge), the operator :mod:`mfpde.tokens.rk` steps.
* :mod:`~mfpde.tokens.sphere.data`: the initial data (``sphere_modes``, seeded noise), its minimum, a product
  quadrature.
* :mod:`~mfpde.tokens.sphere.flow`: the Lagrangian solver μ_t = X_t # μ_0 on quadrature particles.
* :mod:`~mfpde.tokens.sphere.jacobian`: the exact Jacobian of the particle velocity (the flow's stiff phase).
* :mod:`~mfpde.tokens.sphere.diag`, :mod:`~mfpde.tokens.sphere.picture`: degree powers, clusters, the picture.
* :mod:`~mfpde.tokens.sphere.config`, :mod:`~mfpde.tokens.sphere.job`: the domain's config rules and its
  ``transport`` job.
"""
