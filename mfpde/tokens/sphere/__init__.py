"""Tokens on the unit sphere S² (theory §9): layer-normalised tokens in d = 3.

* :mod:`~mfpde.tokens.sphere.theory`: the exact growth rates of the degrees ℓ about the uniform state.
* :mod:`~mfpde.tokens.sphere.velocity`: the velocity protocol every sphere solver takes, the O(n²) direct sum
  (the reference) and the solid-body rotation.
* :mod:`~mfpde.tokens.sphere.harmonics`: real orthonormal spherical harmonics Y_ℓm.
* :mod:`~mfpde.tokens.sphere.mesh`: the icosahedral surface mesh (flat or quadratic), built in code.
* :mod:`~mfpde.tokens.sphere.geometry`, :mod:`~mfpde.tokens.sphere.dg`: upwind DG of degree 0..3 (one normal
  velocity per edge), the operator :mod:`mfpde.tokens.rk` steps.
"""
