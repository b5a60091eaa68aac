"""The parameter side: head families, Θ and ρ₀, the first variation, the Fokker–Planck solver, the free energy.

* :mod:`~mfpde.params.family`: θ ↦ (a(θ), v(θ)) (theory §1.2).
* :mod:`~mfpde.params.theta`: P1 densities on Θ, their head measures, δR/δρ on Θ (§3.1 (G)).
* :mod:`~mfpde.params.densities`: the Gaussian ρ₀ and the Gibbs density.
* :mod:`~mfpde.params.eafe`: the Scharfetter–Gummel rate and P1 helpers.
* :mod:`~mfpde.params.fokker_planck`: the parameter Fokker–Planck step (§4).
* :mod:`~mfpde.params.free_energy`: the training free energy and the frozen-Φ Lyapunov functional.
"""
