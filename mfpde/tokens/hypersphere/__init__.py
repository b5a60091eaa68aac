"""Tokens on S^{d−1} for any d ≥ 2 with zonal data (theory §11): a one-dimensional problem in z = x·e.

* :mod:`~mfpde.tokens.hypersphere.theory`: λ_ℓ⁽ᵈ⁾(β), the growth rates γ_ℓ, K_c = τβ/λ_1, β*⁽ᵈ⁾, in logarithms.
* :mod:`~mfpde.tokens.hypersphere.zonal`: the Gauss rule of the normalised surface measure in z, the orthonormal
  Gegenbauer basis, the azimuthally averaged kernels.
* :mod:`~mfpde.tokens.hypersphere.stationary`: the zonal stationary states of noisy tokens (``mfpde continuation``:
  folds, the Maxwell point of the first-order transition).
* :mod:`~mfpde.tokens.hypersphere.cluster`: the stable clustered branch followed down in K from a clustered state
  to its fold (K_f, K_M where the continuation from K_c does not reach them: large β·d).
* :mod:`~mfpde.tokens.hypersphere.transport`: the flow map on Gauss labels and the finite volumes in the polar angle.
* :mod:`~mfpde.tokens.hypersphere.config`, :mod:`~mfpde.tokens.hypersphere.job`: the domain's config rules and its
  ``transport`` job.
"""
