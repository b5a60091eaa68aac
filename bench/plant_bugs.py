"""Plant known bugs one at a time and see which `mfpde verify --quick` checks or tests catch them.

Each plant is a (file, old text, new text) replacement applied in a detached git worktree of HEAD (the source
tree of the run is never touched), then its catchers run there with ``PYTHONPATH`` pointing at it: the named
checks (``mfpde verify --quick --only ...``; a check named ``mpi2:NAME`` under ``mpiexec -n 2``) and the named
tests (catchers given as pytest node ids, ``tests/...::name``). A plant is caught when verify exits 3 within its
budgets and every named test fails. Prints a table bug → catchers → verdict → the failed checks' detail and
writes ``out/plant_bugs.json``. Run from the repository root:

    python bench/plant_bugs.py [--only NAME ...]

About 10 minutes on 2 cores for all plants.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: name → (file, old, new, checks or tests (pytest node ids) that must catch it, what the bug is)
PLANTS: dict[str, tuple[str, str, str, list[str], str]] = {
    "strang_stale_potential": (
        "mfpde/training/splitting.py",
        '"transport step")\n            self.risk_potentials()\n',
        '"transport step")\n',
        ["risk_transport_order"], "Strang's risk transport: the second Heun stage reuses the first stage's δR/δρ"),
    "depth_indexed_block_order": (
        "mfpde/tokens/box/transport.py",
        "layer = layers[k // per_layer]", "layer = layers[k % len(layers)]",
        ["depth_indexed_particles"], "depth-indexed blocks applied in the wrong order (k % L for k // per_layer)"),
    "depth_indexed_block_order_batched": (
        "mfpde/tokens/box/batch.py",
        "hk, layer = heads[k // per_layer], k // per_layer", "hk, layer = heads[k % len(heads)], k % len(heads)",
        ["batched_gradient_d2"], "the same in the batched solver (the per-sample one is right)"),
    "linear_readout_offset_dropped": (
        "mfpde/tokens/box/readout.py", "return lambda x: x @ wv + b", "return lambda x: x @ wv",
        ["offcentre_exact"], "the linear readout's offset b dropped"),
    "chebyshev_substitution_shift": (
        "mfpde/tokens/box/substitution.py", "C[:, 1, 0], C[:, 1, 1] = beta, lam",
        "C[:, 1, 0], C[:, 1, 1] = 1.01 * beta, lam",
        ["offcentre_exact"], "the Chebyshev substitution's shift β_k off by 1% (multiplied by 0 on symmetric boxes)"),
    "interpolated_vjp_weight": (
        "mfpde/tokens/box/interpolated.py", "gw += T[0] * self.y[:, 0] + T[1] * self.y[:, 1] - T[2]",
        "gw += T[0] * self.y[:, 0] + T[1] * self.y[:, 1] - 1.01 * T[2]",
        ["adjoint_taylor_interpolated"], "the interpolated VJP's mean term off by 1%"),
    "velocity_components_swapped": (
        "mfpde/tokens/box/velocity.py", "vals = lin.tensor.velocity(c)[self.index]",
        "vals = lin.tensor.velocity(c)[self.index][..., ::-1]",
        ["gaussian_exact_d2", "offcentre_exact"], "the d = 2 velocity field with its components swapped"),
    "kl_without_log_z": (
        "mfpde/params/free_energy.py", "logp = -(phi - fmin) / lam - math.log(z)", "logp = -(phi - fmin) / lam",
        ["free_energy_certificate"], "KL(ρ‖p_ρ) without the log Z of the Gibbs density"),
    "muscl_half_substeps": (
        "mfpde/params/muscl.py", "max(1, math.ceil(ds / (0.5 * cfl)))", "max(1, math.ceil(ds / cfl))",
        ["fp_positivity"], "MUSCL sub-step count half as large (sub-steps at the upwind CFL, not half of it)"),
    "limiter_removed": (
        "mfpde/tokens/box/transport.py",
        "return None if self.tokens.degree == 0 else limit(state, self.tokens.cell_dofs, self.tokens.m)",
        "return None", ["token_positivity"], "the DG1 positivity limiter removed (the 2-D solve stalls)"),
    "batched_adjoint_mass": (
        "mfpde/tokens/box/batch.py", "Z = P * self.inv_m  # M symmetric",
        "Z = P * self.inv_m * 1.000001  # M symmetric",
        ["batched_gradient_d2"], "the batched adjoint's M⁻¹ off by 1e-6"),
    "rk_transpose_weight": (
        "mfpde/tokens/rk.py", "pacc[j] = a * q if pacc[j] is None else pacc[j] + a * q",
        "pacc[j] = a * q if pacc[j] is None else pacc[j] + 1.001 * a * q",
        ["adjoint_taylor", "batched_gradient_d2"], "a Shu–Osher α of the transposed step off by 1e-3"),
    "rk_outflow_weight": (
        "mfpde/tokens/rk.py", "a * (out[j] + (b / a) * R[j])", "a * out[j] + (b / a) * R[j]",
        ["token_mass"], "the outflow of a stage with 0 < α < 1 not scaled by α (found by a reviewer's plant)"),
    "dg1_outflow_halved": (
        "mfpde/tokens/box/transport.py", "self.outflow_rate = dolfinx.fem.form(u * vnp * ds)",
        "self.outflow_rate = dolfinx.fem.form(0.5 * u * vnp * ds)",
        ["token_mass"], "the DG1 outflow rate halved (found by a reviewer's plant)"),
    "circle_dg0_cfl_edge": (
        "mfpde/tokens/circle/dg.py",
        "np.max(np.maximum(np.roll(ue, -1), 0.0) + np.maximum(-ue, 0.0))",
        "np.max(np.maximum(np.roll(ue, -1), 0.0))",
        ["circle_mass_positivity"],
        "the DG0 circle CFL counts only the right edge's outflow (the step up to 2× too large)"),
    "circle_usa_cap": (
        "mfpde/tokens/circle/dg.py", "else float(np.exp(min(b, 1e4))))", "else 1.0)",
        ["circle_mass_positivity"],
        "the USA growth cap without the e^β of the scaled Bessel function (a step e^β too large)"),
    "circle_limiter_gauss_only": (
        "mfpde/tokens/circle/dg.py", "vmin = self.mesh.cell_minima(state)", "vmin = state.min(axis=1)",
        ["circle_mass_positivity"], "the circle's positivity limiter enforced at the Gauss points only"),
    "circle_flow_uniform_labels": (
        "mfpde/tokens/circle/map.py", "    return Labels(x, -np.log((1.0 + np.cos(arg) @ a) / (2 * math.pi)),",
        "    return Labels(2 * math.pi * v, -np.log((1.0 + np.cos(arg) @ a) / (2 * math.pi)),",
        ["circle_flow_map"],
        "the flow map's labels at uniform angles, not the quantiles of μ_0 (each still of mass 1/M)"),
    "circle_flow_jacobian_sign": (
        "mfpde/tokens/circle/force.py", "            J[np.diag_indices(M)] -= R[1].real",
        "            J[np.diag_indices(M)] += R[1].real",
        ["circle_flow_map"], "a sign of the flow map's exact Jacobian (its diagonal, USA)"),
    "circle_flow_jacobian_sign_sa": (
        "mfpde/tokens/circle/force.py", "            JN[np.diag_indices(M)] += dN",
        "            JN[np.diag_indices(M)] -= dN", ["circle_flow_map"],
        "a sign of the flow map's exact Jacobian (its diagonal, SA: the stiff phase of the merge)"),
    "circle_flow_sa_dz_sign": (
        "mfpde/tokens/circle/force.py", "self.i0[0], -self.i0[0][1] * float(self.beta[0])",
        "self.i0[0], self.i0[0][1] * float(self.beta[0])", ["circle_flow_map"],
        "the sign of Z' = βN in the SA derivative u' that the map's derivative rides on (found by a breaker)"),
    "circle_flow_series_cut": (
        "mfpde/tokens/circle/force.py", "        self.K = max(series_length(b) for b in a)",
        "        self.K = max(series_length(b) for b in a) // 2",
        ["circle_flow_map"], "the kernel's Fourier series cut at half the terms the Bessel decay needs"),
    "gibbs_missing_inverse_lambda": (
        "mfpde/training/gibbs.py", "e = -(phi - phi.min(axis=1, keepdims=True)) / lam",
        "e = -(phi - phi.min(axis=1, keepdims=True))",
        ["gibbs_fixed_point_branch"], "the proximal Gibbs measure p_ρ ∝ e^{−Φ} without the factor 1/λ"),
    "gibbs_jacobian_sign": (
        "mfpde/training/gibbs.py", "] += Pi @ dphi / lam", "] -= Pi @ dphi / lam",
        ["gibbs_fixed_point_branch"], "the sign of the risk's term in ∂(ρ − p_ρ)/∂ρ (Newton still converges, slowly)"),
    "sphere_velocity_not_tangent": (
        "mfpde/tokens/sphere/velocity.py", "            out[s:s + self.chunk] = tangent(xb, num)",
        "            out[s:s + self.chunk] = num",
        ["sphere_flow_rates"], "the sphere's direct-sum velocity without the projection onto the tangent plane"),
    "dg1_cfl_not_halved": (
        "mfpde/tokens/box/transport.py", "self.cfl = cfl * (1.0 if degree == 0 else 0.5)", "self.cfl = cfl",
        ["token_cfl_substeps"], "the DG1 CFL limit not halved (the Zhang–Shu condition for P1; found by a breaker)"),
    "substeps_floor": (
        "mfpde/tokens/rk.py", "need = np.ceil(dt / (op.max_stable_dt(vel) * ssp) - 1e-12)",
        "need = np.floor(dt / (op.max_stable_dt(vel) * ssp))", ["token_cfl_substeps"],
        "the CFL sub-step count rounded down (one sub-step over the limit, redone with twice as many)"),
    "redo_every_row": (
        "mfpde/tokens/rk.py", "        nsub[broken] *= 2", "        nsub *= 2", ["token_cfl_substeps"],
        "a redone depth step doubles every row's sub-steps, not only the rows that broke the bound (a breaker's)"),
    "redo_late": (
        "mfpde/tokens/rk.py", "broken[idx] = h > op.max_stable_dt(vel) * table.ssp_coefficient * (1 + 1e-9)",
        "broken[idx] = h > op.max_stable_dt(vel) * table.ssp_coefficient * 1.1", ["token_cfl_substeps"],
        "a sub-step up to 10% over the CFL bound not redone"),
    "depth_block_switch_early": (
        "mfpde/tokens/box/transport.py", "layer = layers[k // per_layer]",
        "layer = layers[min((k + 1) // per_layer, len(layers) - 1)]", ["depth_indexed_particles"],
        "the depth-indexed model's next block one depth step early (an O(Δt) = O(h) error: DG1's order sees it)"),
    "depth_block_switch_early_batched": (
        "mfpde/tokens/box/batch.py", "hk, layer = heads[k // per_layer], k // per_layer",
        "hk, layer = heads[min((k + 1) // per_layer, len(heads) - 1)], min((k + 1) // per_layer, len(heads) - 1)",
        ["batched_gradient_d2"], "the same in the batched solver (caught once the blocks' heads differ)"),
    "redo_tolerance": (
        "mfpde/tokens/rk.py", "broken[idx] = h > op.max_stable_dt(vel) * table.ssp_coefficient * (1 + 1e-9)",
        "broken[idx] = h > op.max_stable_dt(vel) * table.ssp_coefficient * 1.005", ["token_cfl_substeps"],
        "a sub-step up to 0.5% over the CFL bound not redone (the batched redo row is 9% over: only its tight case "
        "sees it)"),
    "dg1_cfl_without_boundary": (
        "mfpde/tokens/box/transport.py", '* q("-") * dS\n                                         + vnp * q * ds)',
        '* q("-") * dS)', ["token_cfl_substeps"],
        "the DG1 CFL form without the outflow through ∂Ω (the boundary cell's neighbour rules, 0.75% slower)"),
    "circle_w1_mean_shift": (
        "mfpde/tokens/circle/diag.py", "np.sum(np.abs(D - np.median(D)))", "np.sum(np.abs(D - np.mean(D)))",
        ["tests/tokens/test_circle.py::test_w1_of_two_point_clouds_against_an_optimal_assignment"],
        "the circle W1 shifted by the mean of F − G instead of its median"),
    "circle_particles_rk4_stage": (
        "mfpde/tokens/circle/particles.py", "k3 = velocity(th + 0.5 * dt * k2, beta, softmax)",
        "k3 = velocity(th + 0.5 * dt * k1, beta, softmax)",
        ["tests/tokens/test_circle.py::test_particle_rk4_has_order_4_against_an_adaptive_reference"],
        "the circle particle code's third RK4 stage from k1 (order 2; circle_particles fits only N^{-1/2})"),
    "sphere_one_sided_normal": (
        "mfpde/tokens/sphere/dg.py",
        "        un = 0.5 * (own - own[:, ::-1])  # one normal velocity per edge point: side 1 takes side 0's, negated",
        "        un = own", ["sphere_mass_positivity",
                             "tests/tokens/sphere/test_dg.py::test_mass_to_roundoff_and_positivity_through_cluster_formation"],
        "each side of a sphere edge upwinds with its own conormal (n⁺ ≠ −n⁻ on the faceted sphere: mass not kept)"),
    "slope_tolerance_log": (
        "mfpde/fitting.py", "np.abs(_slope_weights(x)).sum() * -np.log1p(-E))",
        "np.abs(_slope_weights(x)).sum() * np.log1p(E))",
        ["tests/test_fitting.py::test_slope_tolerance_bounds_every_perturbation_and_is_attained"],
        "slope_tolerance with log(1 + E) for −log(1 − E) (a bound that is not one)"),
    "heads_degree_check_removed": (
        "mfpde/config/__init__.py",
        '        (h.degree == 1, "heads.degree", "only degree 1 (P1 with mass lumping) is supported"),\n', "",
        ["tests/test_bad_input.py::test_an_accepted_degree_is_the_degree_built"],
        "the heads.degree check removed (degree 0 or 2 runs P1 and writes its degree into the resolved config)"),
    "resume_block_zero": (
        "mfpde/jobs/records.py", 'theta.set_values(r, ck["rho"][k])', 'theta.set_values(r, ck["rho"][0])',
        ["tests/test_durability.py::test_resume_of_a_depth_indexed_run_gives_the_straight_run"],
        "resume of a depth-indexed run restores block 0's ρ into every block"),
    "certificate_window_wide": (
        "mfpde/training/theory.py", "win = gap >= 10 * certificate_end", "win = gap >= 1 * certificate_end",
        ["tests/training/test_theorems.py::test_certified_rate_fits_only_rows_where_f_star_is_known_to_10_percent"],
        "the run report's certificate window 1 × λ KL instead of 10 × (F* to within 100%, not 10%)"),
    "sphere_wrong_bessel": (
        "mfpde/tokens/sphere/kernel.py", "spherical_in(ll, self.beta)", "spherical_in(ll + 1, self.beta)",
        ["sphere_kernel", "tests/tokens/sphere/test_kernel.py::test_funk_hecke_mode"],
        "the harmonic kernel's eigenvalues 4π i_{ℓ+1}(β) for 4π i_ℓ(β)"),
    "sphere_rank_counted_twice": (
        "mfpde/tokens/sphere/kernel.py", "local = analysis(self.L, x, w)\n",
        "local = analysis(self.L, x, w) * (2.0 if self.comm.rank == 1 else 1.0)\n",
        ["mpi2:sphere_kernel", "tests/tokens/sphere/test_kernel.py::test_one_two_three_ranks_agree"],
        "rank 1's points counted twice in the harmonic kernel's Allreduce (invisible on one rank)"),
    "continuation_jacobian_half": (
        "mfpde/tokens/circle/stationary.py", "Ju = self.R @ (np.eye(self.N) - kappa * SA) @ self.E",
        "Ju = self.R @ (np.eye(self.N) - 0.5 * kappa * SA) @ self.E",
        ["noisy_threshold", "tests/test_continuation.py::test_jacobian_is_exact"],
        "the stationary equation's Jacobian ∂F/∂u with a missing factor 2 in the nonlocal term (K_c at 2τβ/I_1)"),
    "continuation_probe_ratio": (
        "mfpde/bifurcation.py", "for rho in (PROBE, 2 * PROBE):", "for rho in (PROBE, 3 * PROBE):",
        ["noisy_tricritical", "noisy_tricritical_sphere"],
        "the curvature probes at ρ and 3ρ under the Richardson weights of ρ and 2ρ"),
    "continuation_growth_sign": (
        "mfpde/tokens/circle/stationary.py", "L = self.noise * D @ D - K * D @", "L = self.noise * D @ D + K * D @",
        ["tests/test_continuation.py::test_uniform_spectrum_is_the_closed_form"],
        "the linearisation's drift term with the wrong sign (stability flags wrong)"),
    "sphere_stationary_bessel_index": (
        "mfpde/tokens/sphere/stationary.py", "scipy.special.ive(0, ss)", "scipy.special.ive(1, ss)",
        ["noisy_threshold_sphere", "tests/tokens/sphere/test_sphere_stationary.py::test_zonal_kernel_is_funk_hecke"],
        "the zonal kernel's azimuthal integral with I_1 for I_0 (the wrong Bessel index: K_c off τβ/i_1(β))"),
    "sphere_stationary_jacobian_half": (
        "mfpde/tokens/sphere/stationary.py", "return np.eye(self.m) - kappa * SA,",
        "return np.eye(self.m) - 0.5 * kappa * SA,",
        ["noisy_threshold_sphere", "tests/tokens/sphere/test_sphere_stationary.py::test_jacobian_is_exact"],
        "the sphere's stationary Jacobian with a missing factor 2 in the nonlocal term (K_c at 2τβ/i_1)"),
    "sphere_stationary_growth_sign": (
        "mfpde/tokens/sphere/stationary.py", "(self.noise * D - K / b *", "(self.noise * D + K / b *",
        ["tests/tokens/sphere/test_sphere_stationary.py::test_uniform_spectrum_is_the_closed_form"],
        "the sphere's zonal linearisation with the drift's sign flipped (stability flags wrong)"),
    "sphere_stationary_rotation_kept": (
        "mfpde/tokens/sphere/stationary.py", "vals = np.delete(vals, int(np.argmax(align[:4])))",
        "vals = np.delete(vals, len(vals) - 1)",
        ["tests/tokens/sphere/test_sphere_stationary.py::test_azimuthal_second_variation"],
        "the rotations' zero mode kept in the non-zonal stability of a one-cluster state (a spurious marginal mode)"),
    "noisy_sg_bernoulli_sign": (
        "mfpde/tokens/circle/noise.py", "P = ue * self.mesh.h / self.noise", "P = -ue * self.mesh.h / self.noise",
        ["noisy_free_energy"], "the Scharfetter–Gummel flux's Bernoulli argument with the wrong sign (drift reversed)"),
    "noisy_free_energy_factor": (
        "mfpde/tokens/circle/noise.py", "e -= float(c) / (2 * float(beta))", "e -= float(c) / float(beta)",
        ["noisy_free_energy"], "the free energy's interaction term without its factor 1/2"),
    "sphere_dg_frozen_velocity": (
        "mfpde/tokens/sphere/dg.py", "            self.vel.update(self.nodes.x, self.nodes.masses(w))\n",
        "            if not hasattr(self, '_frozen'):\n"
        "                self.vel.update(self.nodes.x, self.nodes.masses(w))\n                self._frozen = True\n",
        ["sphere_dg_flow"], "the sphere DG solver's kernel told μ_0 only (the velocity frozen at the start)"),
    "sphere_data_amplitude": (
        "mfpde/tokens/sphere/data.py", "c[int(ll) ** 2 + int(ll) + int(m)] += float(a)",
        "c[int(ll) ** 2 + int(ll) + int(m)] += 1.05 * float(a)",
        ["sphere_zonal"], "sphere_modes' amplitudes 5% too large (both sphere solvers read the same data)"),
    "sphere_tilt_shift_per_rank": (
        "mfpde/tokens/sphere/tilted.py", "self.comm.Allreduce(local, self._shift, op=MPI.MAX)",
        "self._shift[:] = local",
        ["mpi2:sphere_kernel", "tests/tokens/sphere/test_kernel.py::test_one_two_three_ranks_agree"],
        "the tilted kernel's shifts M_a each rank's own maximum, not the maximum over all ranks"),
    "hypersphere_weight_exponent": (
        "mfpde/tokens/hypersphere/zonal.py", "    lam = (d - 2) / 2\n", "    lam = (d - 1) / 2\n",
        ["hypersphere_threshold"], "the zonal measure's weight (1 − z²)^((d−2)/2) for (1 − z²)^((d−3)/2) (the exponent "
        "d − 2 of sin θ for d − 3)"),
    "hypersphere_gegenbauer_index": (
        "mfpde/tokens/hypersphere/zonal.py", "    nu = (d - 3) / 2\n", "    nu = (d - 2) / 2\n",
        ["hypersphere_threshold"], "the azimuthal kernel's Bessel (Gegenbauer) index (d − 2)/2 for (d − 3)/2"),
    "hypersphere_velocity_derivative": (
        "mfpde/tokens/hypersphere/transport.py", "/ (f0 * (d - 1))", "/ (f0 * (d - 2))",
        ["hypersphere_rates"], "the zonal kernel's derivative with 2(ν+1) = d − 2 for d − 1 (the flow's velocity)"),
    "maxwell_on_unstable_branch": (
        "mfpde/bifurcation.py", "if not (st[i] and st[i + 1]) or", "if (st[i] and st[i + 1]) or",
        ["hypersphere_maxwell"], "the Maxwell condition sought on the branch's unstable part"),
    "twin_adjoint_readout_weight": (
        "mfpde/tokens/box/adjoint.py", "return tokens.m[:n] * g(x)", "return 1.01 * tokens.m[:n] * g(x)",
        ["twin_gradient"], "the adjoint's terminal quadrature weight ∂ŷ/∂μ_i = m_i g(x_i) off by 1%"),
    "twin_readout_offset_dropped": (
        "mfpde/tokens/box/readout.py", "return lambda x: x @ wv + b", "return lambda x: x @ wv",
        ["twin_gradient"], "the linear readout's offset b dropped (the autodiff twin keeps it)"),
    "twin_iid_token_variance": (
        "mfpde/twin/tokens.py", "z = rng.standard_normal((n, d))", "z = 1.1 * rng.standard_normal((n, d))",
        ["twin_tokens_rate"], "the twin's i.i.d. Gaussian tokens drawn with 1.1 times the standard deviation"),
    "twin_fp_drift_factor": (
        "mfpde/training/state.py", "self.phis[k].x.array[:] = dr + self.confinement",
        "self.phis[k].x.array[:] = 0.5 * (dr + self.confinement)",
        ["twin_heads_rate"], "the Fokker–Planck drift with a factor ½ (ρ_s relaxes at half the rate to a Gibbs measure "
        "of twice the temperature)"),

}

#: further plants by area, one module each under ``bench/plants/`` (each defines a ``PLANTS`` dict of the same form)
for _area in sorted((Path(__file__).resolve().parent / "plants").glob("*.py")):
    _ns: dict[str, object] = {}
    exec(compile(_area.read_text(), str(_area), "exec"), _ns)
    _new = _ns["PLANTS"]
    assert isinstance(_new, dict) and not set(_new) & set(PLANTS), f"{_area.name}: plants named twice"
    PLANTS.update(_new)


def _ranks(catcher: str) -> int:
    """The MPI ranks a verify catcher runs on: ``mpi2:NAME`` under ``mpiexec -n 2``, a bare name serially."""
    return int(catcher[3:catcher.index(":")]) if catcher.startswith("mpi") else 1


def run(name: str, tree: Path) -> dict[str, object]:
    """Apply one plant in ``tree``, run its checks and tests, undo it."""
    file, old, new, catchers, what = PLANTS[name]
    checks = [c for c in catchers if "::" not in c]
    tests = [c for c in catchers if "::" in c]
    path = tree / file
    text = path.read_text()
    if text.count(old) != 1:
        return {"name": name, "what": what, "checks": catchers, "caught": None, "detail": "plant site not found"}
    path.write_text(text.replace(old, new))
    out = Path(tempfile.mkdtemp(prefix=f"plant-{name}-"))
    t0 = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": str(tree)}
    rc = test_rc = None
    failed: list[str] = []
    detail = ""
    try:
        for ranks in sorted({_ranks(c) for c in checks}):
            names = [c.split(":")[-1] for c in checks if _ranks(c) == ranks]
            launch = [str(Path(sys.executable).parent / "mpiexec"), "-n", str(ranks)] if ranks > 1 else []
            rep_dir = out / f"ranks{ranks}"
            try:
                proc = subprocess.run([*launch, sys.executable, "-m", "mfpde", "verify", "--quick", "--quiet",
                                       "--only", *names, "--out", str(rep_dir)], env=env, cwd=tree,
                                      capture_output=True, text=True, timeout=1200)
                rc = proc.returncode if rc in (None, 3) else rc
            except subprocess.TimeoutExpired:
                rc = -1
            rep = json.loads((rep_dir / "report.json").read_text()) if (rep_dir / "report.json").exists() else {
                "checks": []}
            failed += [c["name"] for c in rep["checks"] if not c["passed"]]
            detail += "; ".join(f"{c['name']}: {c['detail'][:160]}" for c in rep["checks"] if not c["passed"])
        if tests:
            try:
                proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
                                      env=env, cwd=tree, capture_output=True, text=True, timeout=1200)
                test_rc = proc.returncode
                failed += [line.split()[1] for line in proc.stdout.splitlines() if line.startswith("FAILED ")]
            except subprocess.TimeoutExpired:
                test_rc = -1
    finally:
        path.write_text(text)
    wall = time.perf_counter() - t0
    caught = (not checks or rc == 3) and (not tests or test_rc == 1)
    return {"name": name, "what": what, "checks": catchers, "exit": rc, "pytest_exit": test_rc, "caught": caught,
            "failed": failed, "wall_s": round(wall, 1), "detail": detail}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", default=list(PLANTS))
    ap.add_argument("--working-tree", action="store_true",
                    help="plant into a copy of the working tree's files (uncommitted changes included), not HEAD")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), "HEAD"], check=True,
                       capture_output=True)
        if args.working_tree:
            files = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-co", "--exclude-standard", "-z"],
                                   check=True, capture_output=True, text=True).stdout.split("\0")
            for f in filter(None, files):
                src, dst = ROOT / f, tree / f
                if src.is_file():
                    dst.parent.mkdir(parents=True, exist_ok=True)
                    dst.write_bytes(src.read_bytes())
        try:
            rows = [run(name, tree) for name in args.only]
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], capture_output=True)
    for r in rows:
        print(f"{r['name']:36s} {'CAUGHT' if r['caught'] else 'MISSED'} exit {r.get('exit')} "
              f"{r.get('wall_s')} s by {', '.join(r.get('failed') or []) or '—'}")
    (ROOT / "out").mkdir(exist_ok=True)
    (ROOT / "out" / "plant_bugs.json").write_text(json.dumps(rows, indent=1))
    return 0 if all(r["caught"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
