"""Plants of the hypersphere's finite volumes in the polar angle (Scharfetter–Gummel with noise).

name → (file, old text, new text, the verify checks that must catch it, what the bug is); read by
``bench/plant_bugs.py``.
"""

PLANTS: dict[str, tuple[str, str, str, list[str], str]] = {
    "hypersphere_fv_noise_drift_d_minus_1": (
        "mfpde/tokens/hypersphere/transport.py", "diffusive_drift = tau * (d - 2) * zf / sf",
        "diffusive_drift = tau * (d - 1) * zf / sf",
        ["hypersphere_fv_rates"],
        "the noise's drift τ(d−1) cot θ for τ(d−2) cot θ (the Laplacian of S^d, not of S^{d−1})"),
    "hypersphere_fv_bernoulli_sign": (
        "mfpde/tokens/hypersphere/transport.py", "x = a * hh / tau", "x = -a * hh / tau",
        ["hypersphere_fv_rates"], "the Scharfetter–Gummel Bernoulli argument's sign flipped (the drift upwinded "
        "against itself: tokens pushed up the gradient)"),
    "hypersphere_fv_drift_at_the_centre": (
        "mfpde/tokens/hypersphere/transport.py", "diffusive_drift = tau * (d - 2) * zf / sf",
        "diffusive_drift = tau * (d - 2) * zc[:-1] / sc[:-1]",
        ["hypersphere_fv_rates"], "the weight sin^{d−2}θ's log-derivative (d−2) cot θ taken at the cell centre left "
        "of each face, not at the face (first order)"),
    "hypersphere_fv_velocity_sine_at_the_centre": (
        "mfpde/tokens/hypersphere/transport.py", "a = -sf * g + diffusive_drift", "a = -sc[1:] * g + diffusive_drift",
        ["hypersphere_fv_rates"], "the polar velocity −sin θ G with the sine of the cell centre right of each face, "
        "not the face's (first order; the uniform state's linear rates do not see it, the stationary states do)"),
}
