"""Plants in the continuation and its spectral discretisations, and the checks that catch them.

The files: mfpde/continuation.py, mfpde/bifurcation.py, mfpde/tokens/circle/spectral.py and
mfpde/tokens/sphere/spectral.py.

Read by bench/plant_bugs.py: name → (file, old text, new text, catching checks, what the bug is).
"""

PLANTS: dict[str, tuple[str, str, str, list[str], str]] = {
    "arclength_without_weights": (
        "mfpde/continuation.py", "    a = W * t\n    return newton.solve(pred, a, float(a @ pred))",
        "    a = t\n    return newton.solve(pred, a, float(a @ pred))",
        ["continuation_arclength"], "the pseudo-arclength constraint built without its weights W"),
    "fold_at_step_start": (
        "mfpde/continuation.py",
        'br.events.append(Event("fold", z[:m], float(z[m]), len(br.K), tangent(problem, z, t, W)))',
        'br.events.append(Event("fold", x[:m], float(x[m]), len(br.K), tangent(problem, z, t, W)))',
        ["continuation_fold"], "a fold reported at the step's start, not at the located point"),
    "curvature_4x": (
        "mfpde/bifurcation.py", "return (16 * (Ks[0] - K0) - (Ks[1] - K0)) / (12 * PROBE**2)",
        "return (16 * (Ks[0] - K0) - (Ks[1] - K0)) / (3 * PROBE**2)",
        ["continuation_curvature"], "c₂ (the branch's curvature at K_c) 4× too large (β*, its root, unchanged)"),
    "slope_2x": (
        "mfpde/bifurcation.py", "return (Ks[0] - Ks[1]) / (2 * PROBE)", "return (Ks[0] - Ks[1]) / PROBE",
        ["continuation_curvature"], "c₁ (the branch's slope at its branch point) 2× too large"),
    "landing_sign_lost": (
        "mfpde/continuation.py", "x, t, det0 = y, t_new, det0 if singular else det1", "x, t, det0 = y, t_new, det1",
        ["continuation_landing"],
        "the determinant's sign lost after a step that lands exactly on a branch point (its round-off sign kept)"),
    "stability_at_first_parameter": (
        "mfpde/bifurcation.py", "vals, ok = P.stability(u, K, 2, solver)",
        "vals, ok = P.stability(u, br.K[0], 2, solver)",
        ["continuation_stability"], "each point's stability evaluated at the branch's first K, not its own"),
    "fold_point_not_inserted": (
        "mfpde/continuation.py",
        "            br.u.append(z[:m].copy())  # the located point is a point of the branch\n"
        "            br.K.append(float(z[m]))\n",
        "", ["continuation_fold"], "the located fold reported but not made a point of its branch"),
    "fold_amplitude_of_last_point": (
        "mfpde/bifurcation.py", '"amplitude": mode_amplitude(P, f.u, k)})',
        '"amplitude": mode_amplitude(P, br.u[-1], k)})',
        ["continuation_fold"], "a fold's amplitude read at its branch's last point, not at the fold"),
    "leading_eigenvalue_second": (
        "mfpde/bifurcation.py", "lead.append(float(vals[0].real))", "lead.append(float(vals[1].real))",
        ["continuation_stability"], "the second eigenvalue reported as the leading one"),
    "tangent_unit_in_euclid": (
        "mfpde/continuation.py", "    return t / math.sqrt(float(np.sum(W * t * t)))\n",
        "    return t / math.sqrt(float(np.sum(t * t)))\n",
        ["continuation_arclength"], "the tangent normalised in the Euclidean norm, not in W (steps not of length Δs)"),
    "curvature_with_the_slope": (
        "mfpde/bifurcation.py", "        for r in (rho, -rho):\n", "        for r in (rho, rho):\n",
        ["continuation_curvature"],
        "c₂ from K(ρ), K(2ρ) alone: a transcritical branch's linear term enters it as 14c₁/(12ρ)"),
    "amplitude_of_mode_one": (
        "mfpde/bifurcation.py", '"mode": k, "amplitude": [mode_amplitude(P, u, k) for u in br.u],',
        '"mode": k, "amplitude": [mode_amplitude(P, u, 1) for u in br.u],',
        ["continuation_stability"], "every branch reports mode 1's amplitude, not its own mode's"),
    "spectral_circle_eigenvalue_index": (
        "mfpde/tokens/circle/spectral.py", "self.lam = 2 * math.pi * self._iv[: self.m]",
        "self.lam = 2 * math.pi * self._iv[1 : self.m + 1]",
        ["noisy_threshold", "continuation_fold"],
        "spectral circle: the kernel's eigenvalues one index off (λ_k = 2π I_{k+1}(β))"),
    "spectral_covariance_2x": (
        "mfpde/tokens/spectral_gibbs.py", "SB = p[:, None] * self._VL - np.outer(p, (self._q * p) @ self._VL)",
        "SB = p[:, None] * self._VL - 2 * np.outer(p, (self._q * p) @ self._VL)",
        ["continuation_fold"], "spectral (circle and sphere): the Jacobian's covariance term (the normalisation's) "
        "doubled"),
    "spectral_circle_translation_kept": (
        "mfpde/tokens/circle/spectral.py", "S -= (10 * float(np.abs(S).max()) + 1) * np.outer(y, y)",
        "S += (10 * float(np.abs(S).max()) + 1) * np.outer(y, y)",
        ["continuation_stability"],
        "spectral circle: the sine block's translation mode shifted to the top of the spectrum, not out of it"),
    "spectral_sphere_gram_1d": (
        "mfpde/tokens/sphere/spectral.py", "self.gram = 4 * math.pi / (2 * self.ell + 1)  # ∫_{S²} P_ℓ² dσ",
        "self.gram = 2 / (2 * self.ell + 1)  # ∫_{S²} P_ℓ² dσ",
        ["continuation_fold"], "spectral sphere: the Legendre norm ∫P_ℓ² of [−1, 1] (2/(2ℓ+1)), not of S²"),
    "spectral_sphere_block_kernel_gram": (
        "mfpde/tokens/sphere/spectral.py", "H[np.diag_indices_from(H)] -= K / self.beta * lam * gram",
        "H[np.diag_indices_from(H)] -= K / self.beta * lam",
        ["continuation_stability"],
        "spectral sphere: the stability block's kernel term without the Gram matrix (λ_ℓ, not λ_ℓ ∫P_ℓ² dσ)"),
    "spectral_sphere_eigenvalue_scale": (
        "mfpde/tokens/sphere/spectral.py", "self.lam = 4 * math.pi * self._in[: self.m]",
        "self.lam = 2 * math.pi * self._in[: self.m]",
        ["noisy_threshold_sphere", "continuation_curvature"],
        "spectral sphere: the Funk–Hecke eigenvalues 2π i_ℓ(β) (the circle's factor), not 4π i_ℓ(β)"),
    "spectral_circle_translation_unremoved": (
        "mfpde/tokens/circle/spectral.py", "S -= (10 * float(np.abs(S).max()) + 1) * np.outer(y, y)", "pass",
        ["continuation_stability"],
        "spectral circle: the sine block's translation mode (eigenvalue 0 to the discretisation) left in"),
}
