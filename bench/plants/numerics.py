"""Plants of DG steps, the circle's edge cases, flow-map outputs, the limiter, Gibbs certificates, checkpointing.

name → (file, old text, new text, the verify checks that must catch it, what the bug is); read by
``bench/plant_bugs.py``.
"""

PLANTS: dict[str, tuple[str, str, str, list[str], str]] = {
    "sphere_zxs_without_two_thirds": (
        "mfpde/tokens/sphere/dg.py", "bound = 2.0 / 3.0 * self._w1", "bound = self._w1",
        ["sphere_cfl_substeps"], "the Zhang–Xia–Shu bound without its 2/3 (sub-steps 1.5× too long)"),
    "sphere_lobatto_count": (
        "mfpde/tokens/sphere/dg.py", "n = max(2, math.ceil((p + 3) / 2))", "n = max(2, (p + 3) // 2)",
        ["sphere_cfl_substeps"], "the Gauss–Lobatto count ⌊(p+3)/2⌋ for ⌈(p+3)/2⌉ (DG2's sub-step 3× too long)"),
    "sphere_edge_quadrature_short": (
        "mfpde/tokens/sphere/geometry.py", "np.polynomial.legendre.leggauss(degree + 2)",
        "np.polynomial.legendre.leggauss(degree + 1)",
        ["sphere_quadrature"], "the edge rule one Gauss point short (exact to degree 2p+1, not 2p+3)"),
    "sphere_tilt_radius_doubled": (
        "mfpde/tokens/sphere/tilted.py", "self.r_max = tilt_radius(rtol) / self.beta",
        "self.r_max = 2 * tilt_radius(rtol) / self.beta",
        ["sphere_kernel"],
        "the tilted series' radius doubled (its round-off e^{2βr} squared; its own bound grows too)"),
    "circle_dg0_cfl_wrong_face": (
        "mfpde/tokens/circle/dg.py", "np.max(np.maximum(np.roll(ue, -1), 0.0) + np.maximum(-ue, 0.0))",
        "np.max(np.maximum(np.roll(ue, 1), 0.0) + np.maximum(-ue, 0.0))",
        ["circle_edge_cases"], "the DG0 CFL bound with the left neighbour's face for the right face (a divergent "
        "cell's two outflows never summed)"),
    "circle_cluster_masses_off_by_one": (
        "mfpde/tokens/circle/map.py", "np.cumsum(np.roll(ww, -(cut[-1] + 1)))", "np.cumsum(np.roll(ww, -cut[-1]))",
        ["circle_edge_cases"], "cluster_masses' groups shifted by one label (invisible with equal weights)"),
    "circle_flow_switch_from_velocity": (
        "mfpde/tokens/circle/flow.py", "sigma = max(0.0, -float(solver.f[M:].min()))",
        "sigma = max(0.0, -float(solver.f[:M].min()))",
        ["circle_flow_map"], "the flow map's stiffness switch reads the velocity, not u' (it never switches)"),
    "gibbs_certificate_without_lambda": (
        "mfpde/training/gibbs.py", "return float(lam * (terms @ self.mass).sum())",
        "return float((terms @ self.mass).sum())",
        ["gibbs_fixed_point_branch"], "the Gibbs branch's certificate KL(ρ‖p_ρ) without its λ (0 at fixed points)"),
    "checkpoint_replay_stale_state": (
        "mfpde/tokens/box/tape.py", "            U = op.put(U, rec.idx, new)\n", "",
        ["adjoint_checkpointed"], "a replayed segment steps every sub-step from its checkpoint (the state not "
        "advanced)"),
    "sphere_volume_quadrature_short": (
        "mfpde/tokens/sphere/geometry.py", "basix.make_quadrature(basix.CellType.triangle, 2 * degree + 2)",
        "basix.make_quadrature(basix.CellType.triangle, 2 * degree + 1)",
        ["sphere_quadrature"], "the volume rule one degree short (DG3's volume term with the P3 velocity needs 2p+2)"),
    "circle_dg2_lobatto_count": (
        "mfpde/tokens/circle/dg.py", "nl = max(2, math.ceil((self.degree + 3) / 2))",
        "nl = max(2, math.ceil((self.degree + 2) / 2))",
        ["circle_edge_cases"], "the circle's Gauss–Lobatto count one short for DG2 (its sub-step 3× too long)"),
    "flow_output_at_step_end": (
        "mfpde/tokens/adaptive.py", "            record(dense(t_out[i]))", "            record(solver.y)",
        ["circle_flow_map"], "a flow map's output inside a step recorded as the step's end state (no dense output)"),
    "zhang_shu_short_of_zero": (
        "mfpde/tokens/limiter.py", "theta = np.clip(mean / (mean - vmin), 0.0, 1.0)",
        "theta = np.clip(mean / (mean - 0.9 * vmin), 0.0, 1.0)",
        ["token_positivity"], "the Zhang–Shu scaling stops short of the cell minimum 0 (θ for 0.9 v_min)"),
}
