"""Tokens on the circle θ ∈ [0, 2π) (theory §8): a replicated 1-D solve, by upwind DG or by the flow map.

* :mod:`~mfpde.tokens.circle.dg`: periodic upwind DG with FFT kernels and SSP depth stepping.
* :mod:`~mfpde.tokens.circle.flow`, :mod:`~mfpde.tokens.circle.map`, :mod:`~mfpde.tokens.circle.force`: the flow
  map on quantile labels, its reconstruction, its Fourier-series velocity.
* :mod:`~mfpde.tokens.circle.diag`: CDFs, W1, clusters; :mod:`~mfpde.tokens.circle.particles`: the particle reference.
* :mod:`~mfpde.tokens.circle.job`: the ``transport`` command on the circle; :mod:`~mfpde.tokens.circle.config`: its
  config rules.
"""
