"""Tokens on the unit sphere S² (theory §9): layer-normalised tokens in d = 3.

* :mod:`~mfpde.tokens.sphere.theory`: the exact growth rates of the degrees ℓ about the uniform state.
* :mod:`~mfpde.tokens.sphere.velocity`: the velocity protocol every sphere solver takes, the O(n²) direct sum
  (the reference) and the solid-body rotation.
* :mod:`~mfpde.tokens.sphere.harmonics`: real orthonormal spherical harmonics Y_ℓm.
* :mod:`~mfpde.tokens.sphere.data`: the initial data (``sphere_modes``, seeded noise), its minimum, a product
  quadrature.
* :mod:`~mfpde.tokens.sphere.flow`: the Lagrangian solver μ_t = X_t # μ_0 on quadrature particles.
"""
