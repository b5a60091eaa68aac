"""The numbers of the user docs that tests/test_docs.py does not regenerate: each from the command its page names,
at the page's quick settings or on the smallest meshes it quotes, compared to the digits printed (half a unit of
the last digit shown, unless a test says otherwise). Timings are not compared. The whole file costs about two CPU
minutes on one core."""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
BENCH = ROOT / "bench"
_SUP = str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹⁻", "0123456789-")


def _text(page: str) -> str:
    """The page with its line breaks as spaces."""
    return " ".join((DOCS / page).read_text().split())


def _num(shown: str) -> float:
    """A number as the docs print it: 0.41, −1.9e-5, 3.16·10³, 4·10⁻⁴."""
    s = shown.strip().replace("−", "-").replace("·10", "e").translate(_SUP)
    return float(s)


def _rounds_to(shown: str, value: float) -> bool:
    """``value`` rounded to the digits of ``shown`` (0.827, 2.5e-3, 1.5·10⁻⁹) is ``shown``: within half a unit of
    its last digit."""
    s = shown.strip().replace("−", "-").replace("·10", "e").translate(_SUP)
    mant, _, exp = s.partition("e")
    decimals = len(mant.split(".")[1]) if "." in mant else 0
    unit = 10.0 ** ((int(exp) if exp else 0) - decimals)
    return abs(float(s) - value) <= 0.5 * unit * (1 + 1e-9)


def _bench(name: str):
    sys.path.insert(0, str(BENCH))
    import importlib

    return importlib.import_module(name)


# --- docs/phase_transitions.md -----------------------------------------------------------------------------------


def test_the_phase_threshold_tables_k_c_and_beta_star_rows_are_regenerated():
    """docs/_static/phase_thresholds.md (`python bench/phase_diagrams.py --write-docs`, included by
    docs/phase_transitions.md): every K_c and β* row against `thresholds` of that script (a CPU second): the β, the
    closed forms and Mun–Rosenzweig's K_# as printed; the measured K_c within half a unit of its 15th digit or
    5e-14 relative (the continuation's round-off, as tests/test_bench.py allows); relative errors at round-off
    (below 1e-13) as round-off, others and the measured β* and its error to the digits printed. The folds are the
    smoke run's (tests/test_bench.py)."""
    pd = _bench("phase_diagrams")
    th = pd.thresholds(False)
    text = (DOCS / "_static" / "phase_thresholds.md").read_text()
    rows = re.findall(r"^\| K_c, (\w+) \| ([\d.]+) \| ([\d.]+) \| (?:.*= )?([\d.]+) \| ([^|]+) \| ([\d.]+) \| "
                      r"([\d.]+) \|$", text, re.M)
    assert len(rows) == len(th["K_c"]) == 7, rows
    for (domain, beta, kc, ref, rel, sharp, ratio), r in zip(rows, th["K_c"], strict=True):
        assert (domain, float(beta)) == (r["domain"], r["beta"])
        assert ref == f"{r['closed_form']:.15g}" and sharp == f"{r['K_sharp_MR']:.10g}", (domain, beta)
        assert _rounds_to(kc, r["K_c"]) or abs(float(kc) / r["K_c"] - 1) <= 5e-14, (domain, beta, kc, r["K_c"])
        if r["rel_error"] < 1e-13:
            assert rel.strip() == "0" or _num(rel) < 1e-13, (domain, beta, rel)
        else:
            assert _rounds_to(rel, r["rel_error"]), (domain, beta, rel, r["rel_error"])
        assert ratio == f"{r['K_c'] / r['K_sharp_MR']:.12g}", (domain, beta, ratio)
    stars = re.findall(r"^\| β\*, (\w+) \(N = (\d+)\) \| \| ([\d.]+) \| .*: ([\d.]+) \| (\S+) \(absolute\)", text,
                       re.M)
    assert len(stars) == 2, stars
    for (domain, n, got, ref, err), s in zip(stars, th["beta_star"], strict=True):
        assert (domain, int(n), ref) == (s["domain"], s["points"], f"{s['closed_form']:.10f}")
        assert _rounds_to(got, s["beta_star"]) and _rounds_to(err, s["error"]), (domain, got, err, s)


# --- docs/sphere_atlas.md ----------------------------------------------------------------------------------------


def _atlas_rows() -> tuple[list[str], dict[str, list[str]]]:
    lines = (DOCS / "sphere_atlas.md").read_text().splitlines()
    (head,) = [r for r in lines if r.startswith("| β | 1 | 2 | 3 | 4 | 5 | 6 | 7 | 8 | 9 | 10 |")]
    rows = {r.split(" | ")[0].strip("| "): r.strip("| ").split(" | ")[1:] for r in lines if r.startswith("| ")}
    return head.strip("| ").split(" | ")[1:], rows


def test_the_sphere_atlas_closed_form_rows_and_the_fits_through_its_tables_are_regenerated():
    """docs/sphere_atlas.md (a): ℓ_max(β), ℓ(ℓ+1)/(2√3) and the runner-up's rate over γ_max (closed forms, the
    functions `python bench/sphere_atlas.py` uses), the least-squares factor through the cluster counts at T₁ and at
    1.5 T₁ and the largest distance of a count from it; (c): the fitted T_meta ∝ e^{cβ} through the table's SA
    β = 3..7 and USA β = 3..6 lifetimes and through the medians (β = 2..4 and all five), the medians against the
    tilted pair's lifetimes; the side-by-side: DG2's error ratio 80 → 320 cells and its order (the fits by
    `fit_power` as the script fits them, on the values the tables print; a second)."""
    from mfpde.fitting import fit_power
    from mfpde.tokens.sphere.theory import fastest_degree
    from mfpde.verify.sphere_flow import growth_rate

    betas, rows = _atlas_rows()
    text = _text("sphere_atlas.md")
    x, at1, at15, ratio = [], [], [], []
    for b, lmax, share, counts, runner in zip(betas, rows["ℓ_max(β)"], rows["ℓ(ℓ+1)/(2√3)"], rows["clusters (flow)"],
                                              rows["runner-up rate / γ_max"], strict=True):
        lm = fastest_degree(float(b))
        g = np.sort(growth_rate(np.arange(1, 60), float(b), "softmax"))
        ratio.append(float(g[-2] / g[-1]))
        assert lmax == str(lm) and share == f"{lm * (lm + 1) / (2 * math.sqrt(3)):.1f}", (b, lmax, share)
        assert runner == f"{ratio[-1]:.2f}", (b, runner, ratio[-1])
        for c in counts.split("/"):
            m = re.fullmatch(r"(\d+)(?: \((\d+)\))?", c.strip())
            assert m, (b, c)
            x.append(lm * (lm + 1) / (2 * math.sqrt(3)))
            at15.append(int(m[1]))
            at1.append(int(m[2] or m[1]))
    xs = np.array(x)
    fits = [float(xs @ np.array(y) / (xs @ xs)) for y in (at1, at15)]
    worst = max(float(np.max(np.abs(np.array(y) - c * xs))) for y, c in zip((at1, at15), fits, strict=True))
    assert (f"the least-squares factor through the counts at T₁ is {fits[0]:.2f} ({fits[1]:.2f} at 1.5 T₁), every "
            f"count within ±{worst:.1f} of it") in text, (fits, worst)
    late = [1 - r for b, r in zip(betas, ratio, strict=True) if float(b) >= 8]
    m = re.search(r"the runner-up degree grows within 0–(\d+)% as fast as ℓ_max \(β = ([\d, ]+): within (\d+)%\)",
                  text)
    assert m and round(100 * max(late)) <= int(m[1]) and min(late) < 0.005, (m, late)
    close = [1 - ratio[betas.index(b)] for b in m[2].split(", ")]
    assert max(close) <= int(m[3]) / 100, close

    def cells(name: str) -> list[float]:
        return [_num(c) if re.fullmatch(r"[\d.]+(·10\S+)?", c) else math.nan for c in rows[name]]

    sa, usa = cells("T_meta (SA)"), cells("T_meta (USA)")
    for law, want in ((fit_power(np.exp(np.arange(3.0, 8.0)), sa[2:7]), "c = {:.3f} ± {:.3f} (SA, β = 3..7)"),
                      (fit_power(np.exp(np.arange(3.0, 7.0)), usa[2:6]), "and {:.2f} ± {:.2f} (USA, β = 3..6)")):
        assert want.format(law.q, law.se_q) in text, (want, law.q, law.se_q)
    med = [_num(c) for c in rows["T_meta median"]]
    three, five = fit_power(np.exp([2.0, 3.0, 4.0]), med[:3]), fit_power(np.exp([2.0, 3.0, 4.0, 5.0, 6.0]), med)
    assert f"T_meta ∝ e^{{cβ}} with c ≈ {three.q:.1f}" in text and f"(c ≈ {three.q:.1f} ± {three.se_q:.1f})" in text
    assert f"gives c = {five.q:.1f} ± {five.se_q:.1f}".replace("-", "−") in text, (five.q, five.se_q)
    factor = max(max(a / b, b / a) for a, b in zip(med[:3], sa[1:4], strict=True))
    assert f"within a factor {factor:.1f} of the tilted pair's lifetimes ({rows['T_meta (SA)'][1]}, " \
           f"{rows['T_meta (SA)'][2]}, {rows['T_meta (SA)'][3]})" in text, factor
    dg = {(r.split(" | ")[0].strip("| "), r.split(" | ")[1]): r.strip("| ").split(" | ")
          for r in (DOCS / "sphere_atlas.md").read_text().splitlines() if re.match(r"\| DG\d \| \d+ \| \d+ \|", r)}
    e80, e320 = _num(dg[("DG2", "80")][3]), _num(dg[("DG2", "320")][3])
    falls = f"DG2's error falls {e80 / e320:.1f}× from 80 to 320 cells (order ≈ {math.log2(e80 / e320):.1f} in h)"
    assert falls in text, falls


def test_the_sphere_side_by_side_errors_are_regenerated():
    """docs/sphere_atlas.md, the side by side: the flow solver's errors of the degree powers at the settings its
    tables name (`python bench/bench_sphere.py`'s functions, both cases; a few CPU seconds, the references at
    N = 32 and 48 most of it). The error is the quadrature's: any kernel gives it to round-off."""
    bench = _bench("bench_sphere")
    text = _text("sphere_atlas.md")
    for case, ref_n, rows in (("modes", 32, [(10, 1e-6, "N = 10, direct sum; {}"), (16, 1e-4, "N = 16, harmonic; {}"),
                                            (24, 1e-6, "N = 24, harmonic; {}")]),
                              ("zonal", 48, [(16, 1e-4, "N = 16, direct sum; {}"), (24, 1e-4, "N = 24, harmonic; {}"),
                                             (28, 1e-6, "N = 28, harmonic; {}")])):
        bench.use_case(case)
        ref = bench.flow_power(ref_n, 1e-13)[0]
        for N, rtol, shown in rows:
            e = bench.err(bench.flow_power(N, rtol)[0], ref)
            want = shown.format(f"{e:.1e}".replace("e-0", "e-"))
            assert want in text, (case, want)


def test_the_sphere_atlas_small_beta_runs_are_regenerated():
    """docs/sphere_atlas.md: `python bench/sphere_atlas.py`'s runs at the smallest β, by its functions: the cluster
    counts of (a) at β = 1 and 2 (seeds 0, 1, 2; 288 particles) and the two-cluster lifetimes of (c) at β = 1 and
    2, SA and USA (128 particles), to the 3 digits printed (about 6 CPU s; the larger β take minutes each and are
    the script's measurements)."""
    atlas = _bench("sphere_atlas")
    betas, rows = _atlas_rows()
    for b in (1.0, 2.0):
        got = atlas.counts([b], (0, 1, 2))
        want = "/".join(str(r["clusters_1.5T"]) + (f" ({r['clusters_T']})" if r["clusters_T"] != r["clusters_1.5T"]
                                                    else "") for r in got)
        assert rows["clusters (flow)"][betas.index(f"{b:g}")] == want, (b, want)
    for att, name in (("softmax", "T_meta (SA)"), ("unnormalised", "T_meta (USA)")):
        for b in (1, 2):
            r = atlas.lifetime(float(b), att, atlas.TWO_MODES, 8, 1e10, 2)
            assert rows[name][b - 1] == f"{r['T_meta']:.3g}", (att, b, r["T_meta"])


# --- docs/sphere.md ----------------------------------------------------------------------------------------------


def test_the_sphere_pages_stiff_switch_rule_and_jacobian_memory_are_the_codes():
    """docs/sphere.md: the switch to the stiff integrator (15 accepted steps with h ρ above 6.1, reset by 6 calm
    steps) is the flow solver's rule, and the dense Jacobian and its LU, 2 × (3n)² doubles, take the bytes the
    solver's memory test uses (`stiff_bytes`) at 20 000 particles."""
    from mfpde.tokens.sphere import flow

    text = _text("sphere.md")
    assert (f"{flow.SWITCH_STEPS} accepted steps with h ρ above {flow.SWITCH_H_RHO:g} (ρ its estimate of the "
            f"largest eigenvalue of the Jacobian), a count that only {flow.SWITCH_RESET} non-stiff steps in a row "
            "reset") in text
    assert flow.stiff_bytes(20000) == 2 * 8 * (3 * 20000) ** 2
    assert f"2 × (3n)² doubles ({flow.stiff_bytes(20000) / 1e9:.0f} GB at 20 000 particles)" in text


def test_the_sphere_pages_noisy_orders_are_regenerated():
    """docs/sphere.md, noisy tokens: the relative errors of the decay rate −τℓ(ℓ+1) of Y_ℓ0 without drift (τ = 1, to
    depth 0.05) at 320, 1280 and 5120 cells, the offset of the discrete threshold from K_c = τβ/i_1(β) at 320 and
    1280 cells (β = 1 and 3, τ = 1/2; from the growth rate of Y_10 at K_c, 2(K i_1(β)/β − τ) = 0 exactly: the
    offset is |rate|/2τ of K_c) and its order, and the sub-steps per unit depth at 5120 cells and τ = 1, by the
    solver of `mfpde transport` with `tokens.noise` (the runs of tests/tokens/sphere/test_sphere_noise.py; about 12
    CPU s)."""
    from mpi4py import MPI

    import scipy.special as sp

    from mfpde.fitting import fit_order
    from mfpde.tokens.sphere.harmonics import real_harmonics
    from mfpde.tokens.sphere.kernel import HarmonicVelocity
    from mfpde.tokens.sphere.mesh import edge_lengths, icosphere
    from mfpde.tokens.sphere.noise import NoisySphereFV
    from mfpde.tokens.sphere.velocity import RotationVelocity

    comm = MPI.COMM_SELF

    def amplitude(op, mu, ell: int, col: int) -> float:
        x, w = op.quadrature(mu)
        return float(real_harmonics(ell, x)[:, col] @ w)

    def rate(op, ell: int, col: int, mu0, T: float):
        mu = op.project(mu0)
        rep = op.solve(mu, T, 1)
        return math.log(amplitude(op, rep.mu_T, ell, col) / amplitude(op, mu, ell, col)) / T, rep.substeps

    text = _text("sphere.md")
    still = RotationVelocity([0.0, 0.0, 0.0])
    decay = {}
    for ell in (1, 2):
        col = ell * ell + ell
        decay[ell] = []
        for r in (2, 3, 4):
            op = NoisySphereFV(icosphere(comm, r), still, 1.0)
            got, steps = rate(op, ell, col, lambda x, ell=ell, col=col: 1 / (4 * math.pi) + 0.01 * real_harmonics(
                ell, x)[:, col], 0.05)
            decay[ell].append(f"{abs(got + ell * (ell + 1)) / (ell * (ell + 1)):.1e}".replace("e-0", "e-"))
    per_depth = steps / 0.05  # refine 4, τ = 1: Δt ∝ h²/τ
    assert (f"relative errors {', '.join(decay[1])} (ℓ = 1) and {', '.join(decay[2])} (ℓ = 2) at 320, 1280, 5120 "
            "cells") in text, decay
    m = re.search(r"\(5120 cells at τ = 1: about (\d+) sub-steps per unit depth\)", text)
    assert m and abs(int(m[1]) - per_depth) <= 0.05 * per_depth, (m, per_depth)
    tau = 0.5
    offsets = {}
    for beta in (1.0, 3.0):
        kc = tau * beta / sp.spherical_in(1, beta)
        offsets[beta] = []
        for r in (2, 3):
            op = NoisySphereFV(icosphere(comm, r), HarmonicVelocity(beta, "unnormalised", comm, c=kc, tol=1e-10), tau)
            got, _ = rate(op, 1, 2, lambda x: 1 / (4 * math.pi) + 1e-3 * real_harmonics(1, x)[:, 2], 0.1)
            offsets[beta].append(abs(got) / (2 * tau))
    shown = [f"{e:.1e}".replace("e-0", "e-") for e in offsets[1.0]]
    assert [f"{e:.1e}" for e in offsets[3.0]] == [f"{e:.1e}" for e in offsets[1.0]], offsets  # "β = 1 and 3 alike"
    hs = [edge_lengths(icosphere(comm, r))[1] for r in (2, 3)]
    order = fit_order(hs, offsets[1.0])
    assert (f"the discrete threshold is off by {shown[0]}, {shown[1]} of K_c at 320, 1280 cells (order {order:.1f}; "
            "β = 1 and 3 alike)") in text, (shown, order)


def test_the_sphere_pages_measured_rotation_errors_and_flow_rates_are_regenerated():
    """docs/sphere.md's *Measured*: DG1's relative L2 errors of the rotated cap at T = π/2 on 80, 320 and 1280 cells
    (`rotation_error` of the check `sphere_rotation`), also the check row's 1280-cell value, and the flow solver's
    growth-rate errors at N = 16, rtol 1e-13 (β = 5 SA, β = 9 USA; `sphere_flow_rates` of the check
    `sphere_flow_rates`), to the digits printed (about 8 CPU s)."""
    from mfpde.verify.sphere_dg import rotation_error
    from mfpde.verify.sphere_flow import DEGREES, growth_rate, sphere_flow_rates

    text = _text("sphere.md")
    from mfpde.fitting import fit_order

    err, h = zip(*(rotation_error(r, 1, 1) for r in (1, 2, 3)), strict=True)
    shown = [f"{err[0]:.2f}"] + [f"{e:.1e}".replace("e-0", "e-") for e in err[1:]]
    order = fit_order(list(h), list(err))
    assert f"DG1 rotation errors {', '.join(shown)} at 80, 320, 1280 cells (order {order:.0f})" in text, (shown, order)
    assert f"at 1280 cells (measured {shown[2]})" in text
    flow = []
    for beta, att in ((5.0, "softmax"), (9.0, "unnormalised")):
        ex = growth_rate(DEGREES, beta, att)
        flow.append(float(np.max(np.abs(sphere_flow_rates(16, beta, att) - ex)) / ex.max()))
    assert f"flow growth rates {flow[0]:.0e} (β = 5) and {flow[1]:.0e} (β = 9, USA)".replace("e-0", "e-") in text, flow


@pytest.mark.serial
def test_the_sphere_pages_dg_demo_is_regenerated(tempdir):
    """docs/sphere.md: `mfpde transport demos/sphere.toml` (DG1 on 1280 cells, about 80 CPU s: the costliest test of
    this file): its sub-steps, mass error, the bumps at t = 8 and t = 12 and the merge between them, in the text
    and in the figure's caption (the CPU time is not compared)."""
    import json

    from mfpde.cli import main

    words = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]
    out = tempdir / "sphere_dg"
    assert main(["transport", str(ROOT / "demos" / "sphere.toml"), "--out", str(out), "--quiet", "--set",
                 "output.plots=false", "--set", "output.fields=false"]) == 0
    s = json.loads((out / "report.json").read_text())["samples"][0]
    at = dict(zip(s["t"], s["clusters_t"], strict=True))
    assert s["cells"] == 1280 and s["t"][-1] == 12.0 and at[12.0] == s["clusters_T"]
    merges = [t for t in s["merge_times"] if 8.0 < t <= 12.0]
    text = _text("sphere.md")
    assert (f"CPU, {s['substeps']} sub-steps, mass error {s['mass_error']:.0e}): {words[at[8.0]]} bumps at t = 8, "
            f"{words[at[12.0]]} at t = 12 (one merge at t = {merges[0]:g})") in text, s
    assert len(merges) == 1 and at[8.0] - at[12.0] == 1
    assert f"from small modes to {words[at[8.0]]} clusters at t = 8, {words[at[12.0]]} at t = 12 (DG1 on 1280" in text


def test_the_sphere_pages_stiff_switch_of_the_usa_run_is_regenerated(tempdir):
    """docs/sphere.md: the unnormalised β = 20 flow run the page gives, to depth 10⁻⁵ only (the switch happens
    before it; the stiff phase to T = 12 takes a CPU minute): the kernel, the particles, the switch depth
    and the explicit steps before it (about 7 CPU s)."""
    import json

    from mfpde.cli import main

    out = tempdir / "usa20"
    assert main(["transport", str(ROOT / "demos" / "sphere.toml"), "--out", str(out), "--quiet", "--set",
                 "tokens.solver='flow'", "--set", "tokens.attention='unnormalised'", "--set", "tokens.beta=20",
                 "--set", "depth.T=1e-5", "--set", "depth.steps=1", "--set", "output.plots=false", "--set",
                 "output.fields=false"]) == 0
    s = json.loads((out / "report.json").read_text())["samples"][0]
    mant, exp = f"{s['integrator']['switch_t']:.1e}".split("e")
    switch = f"{mant}·10{str(int(exp)).translate(str.maketrans('-0123456789', '⁻⁰¹²³⁴⁵⁶⁷⁸⁹'))}"
    kernel = ("summed directly" if s["kernel"] == "direct" else
              f"{s['kernel']} kernel of degree {s['kernel_degree']}")
    assert (f"({s['labels']} particles, {kernel}): about a CPU minute, the "
            f"switch at t = {switch} after {s['integrator']['explicit_steps']} explicit steps") in _text("sphere.md"), s


def test_the_sphere_pages_round_off_held_steps_are_regenerated(tempdir):
    """docs/sphere.md: where ε e^β passes the default rtol, the same run at rtol 1e-8 (its steps, about 2 000, and
    about a CPU second), and the β = 30 run that stops: the held step with 32 particles, the steps left, and the
    stall guard's constants."""
    import json
    import math
    import re

    from mfpde.cli import main
    from mfpde.tokens.adaptive import STALL_SPREAD, STALL_STEPS, STALL_WINDOW, STALL_WINDOWS

    text = _text("sphere.md")
    beta = math.ceil(math.log(1e-10 / 2.0**-52))  # the first integer β with ε e^β above 1e-10
    assert f"above the default `tokens.rtol = 1e-10` from β ≈ {beta} on" in text
    base = ["transport", str(ROOT / "demos" / "sphere.toml"), "--quiet", "--set", "tokens.solver='flow'", "--set",
            "tokens.attention='unnormalised'", "--set", "output.plots=false", "--set", "output.fields=false"]
    out = tempdir / "usa20"
    assert main([*base, "--out", str(out), "--set", "tokens.beta=20", "--set", "tokens.rtol=1e-8"]) == 0
    s = json.loads((out / "report.json").read_text())["samples"][0]
    assert 1500 <= s["substeps"] <= 3000 and s["solve_cpu_s"] < 10, s["substeps"]  # "about 2 000", "a CPU second"
    assert "to T = 12 in about 2 000 steps and a CPU second" in text
    out = tempdir / "usa30"
    assert main([*base, "--out", str(out), "--set", "tokens.beta=30", "--set", "depth.T=10", "--set",
                 "tokens.labels=32"]) == 3
    err = json.loads((out / "report.json").read_text())["error"]
    said = re.search(r"stayed at ([0-9.e+-]+) for \d+ steps, ([0-9.e+-]+) more such", err)
    assert said, err
    h, left = float(said[1]), float(said[2])
    num = r"([0-9.·⁻⁰¹²³⁴⁵⁶⁷⁸⁹]+)"
    shown = re.search(rf"stop changing altogether \(about {num} with 32 particles, {num} of them to T = 10\)", text)
    assert shown, "the page's β = 30 sentence"
    # where the guard fires depends on the last digits of LSODA's steps: the page's two significant digits, ±10%
    assert abs(_num(shown[1]) / h - 1) < 0.1 and abs(_num(shown[2]) / left - 1) < 0.1, (shown.groups(), err)
    assert (STALL_SPREAD, STALL_WINDOW * STALL_WINDOWS, STALL_STEPS) == (1.25, 4000, 10**7)
    assert "stayed within 25% of each other for 4 000 steps with more than 10⁷ still to go" in text


# --- docs/digits.md ----------------------------------------------------------------------------------------------


def test_the_digits_screen_summary_is_regenerated(tmp_path):
    """docs/digits.md: `python bench/digit_pairs.py` (the screen over all 45 pairs × 2 readouts, about 45 CPU s):
    the number of cases, the cases whose first-order bound gains more than 0.1 over max(mean sign, 1 − mean sign)
    with their mean sign and bound, and the count of the others that gain more than 0.1 over the mean sign only."""
    digit_pairs = _bench("digit_pairs")
    rows = digit_pairs.main(["--out", str(tmp_path / "screen.json")])
    both = [r for r in rows if r["constrained"] - max(r["mean_sign"], 1 - r["mean_sign"]) > 0.1]
    only = [r for r in rows if r["constrained"] - r["mean_sign"] > 0.1 and r not in both]
    assert len(both) == 2 and all(r["readout"] == "horizontal" for r in both), both
    a, b = sorted(both, key=lambda r: -r["constrained"])
    text = _text("digits.md")
    assert (f"of the {len(rows)} cases only **{a['pair'][0]} vs {a['pair'][1]} horizontal** (mean sign "
            f"{a['mean_sign']:.3f}, bound {a['constrained']:.3f}) and {b['pair'][0]} vs {b['pair'][1]} horizontal "
            f"({b['mean_sign']:.3f} → {b['constrained']:.3f}) gain more than 0.1 over max(mean sign, 1 − mean sign); "
            f"{len(only)} more gain more than 0.1 over the mean sign only") in text, (len(rows), both, len(only))


def test_the_digits_box_tables_value_heads_row_is_the_embedded_default():
    """docs/digits.md: the box table's row of value heads at a = −4 is the embedded default (`mfpde run`), whose
    accuracies, risk and boundary mass tests/test_docs.py regenerates from the page's prose; here the row against
    that prose (the other rows are `python bench/digit_box.py`'s, about 20 CPU minutes)."""
    text = _text("digits.md")
    (row,) = [r for r in (DOCS / "digits.md").read_text().splitlines() if r.startswith("| value, a = ")]
    cells = [c.strip() for c in row.strip("| ").split(" | ")]
    alist = [a.strip("* ") for a in cells[0].removeprefix("value, a = ").split("/")]
    accs = [c.strip("* ") for c in cells[3].split(" → ")[1].split("/")]
    best = alist.index("−4")
    start = cells[3].split(" → ")[0]
    m = re.search(r"held-out accuracy (\S+) → (\S+) \(\+(\d+) points\)", text)
    assert m and (m[1], m[2]) == (start, accs[best]), (m, start, accs[best])
    assert int(m[3]) == round(100 * (float(m[2]) - float(m[1]))), m[3]
    assert cells[2] == "< 10⁻¹⁷" and "Θ boundary mass 3·10⁻¹⁹" in text
    risks = re.search(r"a = −4 has the least training risk \(([\d.]+); ([\d.]+) at −6, ([\d.]+) at −2, ([\d.]+) at −8",
                      text)
    assert risks and float(risks[1]) < min(float(x) for x in risks.groups()[1:]), risks


# --- docs/free_energy.md -----------------------------------------------------------------------------------------


def test_the_free_energy_pages_particle_floors_at_h_1024_are_regenerated():
    """docs/free_energy.md's *MFLD particles: floors*, the H = 1024 rows (value and scalar heads, 8 seeds, Δs = 0.1):
    the mean floor of the k-NN and of the KDE estimate ± their standard errors over the seeds and one run's RMS
    error ε_H, by `particles` of bench/fe_runs.py as bench/bench_free_energy.py runs it and reduced as its
    `floors_table` does, to the digits printed (about 10 CPU s; H = 4096 and 16 384 take minutes, their rows and the
    timings are the benchmark's). The same ε_H in the table of times."""
    fe_runs = _bench("fe_runs")
    horizon = {"value": 16.0, "scalar": 14.0}  # bench_free_energy.run's S
    page = (DOCS / "free_energy.md").read_text()
    for fam in ("value", "scalar"):
        steps = round(horizon[fam] / 0.1)
        kde_rows = sorted({0, *np.unique(np.geomspace(1, steps, 22).astype(int)).tolist()})
        runs = [fe_runs.particles(fam, 1024, sd, 0.1, steps, kde_rows) for sd in range(8)]
        last = max(1, len(runs[0]["s"]) // 4)
        knn = np.array([r["knn"] for r in runs])[:, -last:]
        kf = knn.mean(axis=1)
        rows = [i for i in kde_rows if i >= len(runs[0]["s"]) - last]
        kd = np.array([np.mean(np.asarray(r["kde"])[rows]) for r in runs])
        se_k, se_d = kf.std(ddof=1) / math.sqrt(len(kf)), kd.std(ddof=1) / math.sqrt(len(kd))
        rms = float(np.sqrt(np.mean(knn**2)))
        m = re.search(rf"^\| {fam} \| 1024 \| 8 \| (\S+) ± (\S+) \| (\S+) ± (\S+) \| (\S+) \|", page, re.M)
        assert m, fam
        for shown, value in zip(m.groups(), (kf.mean(), se_k, kd.mean(), se_d, rms), strict=True):
            assert _rounds_to(shown.replace("+", ""), value), (fam, shown, value)
        timed = re.search(rf"^\| {fam} \| MFLD H = 1024, closed form \| .* \| (\S+): ", page, re.M)
        assert timed and timed[1] == m[5], (fam, timed)


def test_the_free_energy_pages_particle_prose_follows_from_its_tables():
    """docs/free_energy.md, the particles' prose: the scalar heads' bias at H = 4096 as a multiple of 1/H, the heads
    a single run needs for 1e-5 at the H^{−1/2} rate from ε_H at H = 16 384, and the Euler–Maruyama bias of the
    stationary law in closed form, λ·½(r − 1 − log r) with r = 1/(1 − λ₂Δs/2) (value heads, λ = 0.1, λ₂ = 1,
    Δs = 0.1; the constants of bench/fe_runs.py)."""
    fe_runs = _bench("fe_runs")
    page = (DOCS / "free_energy.md").read_text()
    text = _text("free_energy.md")
    bias = re.search(r"^\| scalar \| 4096 \| 8 \| \+(\S+) ± (\S+) \|", page, re.M)
    assert bias and f"H = 4096 (+{bias[1]} ± {bias[2]}, about {float(bias[1]) * 4096:.1f}/H)" in text, bias
    eps = re.search(r"^\| value \| 16 384 \| 8 \(2 KDE\) \| \S+ ± \S+ \| \S+ ± \S+ \| (\S+) \|", page, re.M)
    assert eps
    heads = 16384 * (float(eps[1]) / 1e-5) ** 2
    mant, exp = f"{heads:.0e}".split("e")
    power = str(int(exp)).translate(str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹"))
    assert f"a single run would need about {mant}·10{power} heads to see 1e-5" in text, heads
    assert (fe_runs.LAM, fe_runs.LAM2) == (0.1, 1.0)
    r = 1 / (1 - fe_runs.LAM2 * 0.1 / 2)
    em = fe_runs.LAM * 0.5 * (r - 1 - math.log(r))
    assert f"λ·½(r − 1 − log r) ≈ {em:.0e} in the gap".replace("e-05", "e-5") in text, em


# --- docs/benchmarks.md ------------------------------------------------------------------------------------------
# The timings are machine-dependent and not compared; tests/test_bench.py runs every command shortened (DOC_BENCH).


def test_the_benchmarks_pages_deterministic_numbers_are_regenerated(tempdir):
    """docs/benchmarks.md: the final risk of the embedded default at 40 training steps, to the last bit, as
    `python bench/bench_run.py --steps 40` runs it (`mfpde run --set training.steps=40`; 3 CPU s); K_c = τβ/I_1(β)
    at β = 2 (closed form) and K_M on S^15 (`fold_maxwell_point`, the independent spectral solve the table
    compares with), to the digits printed; the reference solve of `python bench/bench_transport.py` in d = 1 (its
    sub-steps and mass error; a CPU second)."""
    import json

    import scipy.special

    from mfpde.cli import main
    from mfpde.verify.hypersphere_reference import fold_maxwell_point

    text = _text("benchmarks.md")
    out = tempdir / "default40"
    assert main(["run", "--out", str(out), "--quiet", "--set", "training.steps=40", "--set", "output.fields=false",
                 "--set", "output.plots=false"]) == 0
    risk = json.loads((out / "report.json").read_text())["final"]["risk"]
    assert f"the same to the last bit ({risk!r} at 40 steps)" in text, risk
    kc = 2.0 / float(scipy.special.iv(1, 2.0))
    assert f"K_c = τβ/I_1(β) = {kc:.15g}" in text and f"| continuation, N = 63 | {kc:.15g} |" in text, kc
    km = fold_maxwell_point(2.0, 1.0, 16, 80).K_M
    m = re.search(r"\| continuation, 64 points \| ([\d.]+) \|", text)
    assert m and _rounds_to(m[1], km), (m, km)
    transport = _bench("bench_transport")
    hm, _ = transport._heads(48)
    tt, u = transport._solver(1, 400)
    rep = tt.solve(u, hm, 1.0, 100, g=lambda x: x[:, 0])
    assert f"d = 1, 400 cells, 48×48 Θ mesh: **0.80 s** ({rep.substeps} sub-steps)" in text, rep.substeps
    assert f"Mass error {rep.mass_error:.0e} in both".replace("e-0", "e-") in text, rep.mass_error


# --- docs/development.md -----------------------------------------------------------------------------------------


def test_the_development_pages_sphere_kernel_sizes_are_the_closed_forms():
    """docs/development.md, the sphere's kernel: the Allreduce's 8(L+1)² bytes at L = 28 and 32, the tilted kernel's
    ρ = ½ log(1e-6/4ε), its K centres at β = 20 and 40, its degree L and its Allreduce of 4K(L+1)² doubles, by the
    functions of mfpde.tokens.sphere the kernel uses (closed forms; the timings are `bench/bench_sphere_kernel.py`'s
    as measured)."""
    from mfpde.tokens.sphere.series import harmonic_degree
    from mfpde.tokens.sphere.tilted import fibonacci_centres, tilt_radius

    text = _text("development.md")
    assert (f"8 (L+1)² bytes gives every rank the whole series ({8 * 29**2 / 1e3:.1f} kB at L = 28, β = 9; "
            f"{8 * 33**2 / 1e3:.1f} kB at L = 32)") in text
    rho = tilt_radius(1e-6)
    assert f"ρ = ½ log(1e-6/4ε) ≈ {rho:.1f})" in text, rho
    k = {b: len(fibonacci_centres(rho / b)) for b in (20, 40)}
    L = harmonic_degree(rho, 1e-14)
    assert f"K ≈ 8β²/ρ² ({k[20]} at β = 20, {k[40]} at β = 40), L = {L};" in text, (k, L)
    mb = {b: 4 * k[b] * (L + 1) ** 2 * 8 / 1e6 for b in (20, 40)}
    assert f"4K(L+1)² doubles ({mb[20]:.2f} MB at β = 20, {mb[40]:.1f} MB at β = 40)" in text, mb


def test_the_development_pages_hypothesis_config_count_is_the_tests():
    """docs/development.md: the configs hypothesis draws in tests/config/test_fuzz_configs.py (its `max_examples`)."""
    fuzz = (ROOT / "tests" / "config" / "test_fuzz_configs.py").read_text()
    (n,) = re.findall(r"@settings\(max_examples=(\d+)", fuzz)
    assert f"{n} configs drawn by hypothesis end 0, 2 or 3" in _text("development.md"), n


def test_the_hysteresis_prose_is_the_stored_sweep():
    """docs/phase_transitions.md, *Hysteresis by time stepping*: the sweep's settings and the end states the prose
    quotes against docs/_static/phase_hysteresis.json, which `python bench/phase_diagrams.py --write-docs` writes
    with the figure (the sweep is 38 runs to depth 200, about 10 CPU minutes: tests/test_bench.py runs it shortened
    with --smoke). |μ̂₁| ≤ 10⁻³ is the page's "uniform"."""
    import json

    sweep = json.loads((DOCS / "_static" / "phase_hysteresis.json").read_text())
    K, up, down = np.array(sweep["K"]), np.array(sweep["up"]), np.array(sweep["down"])[::-1]  # down: along K[::-1]
    text = _text("phase_transitions.md")
    step = float(np.round(K[1] - K[0], 6))
    assert (f"DG0 Scharfetter–Gummel solver of `mfpde transport` ({sweep['cells']} cells) is run to depth "
            f"{sweep['depth']:g} at each K of a sweep from {K[0]:g} up to {K[-1]:g} and back in steps of "
            f"{step:g}") in text
    at = {round(float(k), 6): i for i, k in enumerate(K)}
    m = re.search(r"Going up, the uniform state stays \(\|μ̂₁\| ≤ 10⁻³\) to K = ([\d.]+), .* at ([\d.]+) it has "
                  r"grown to ([\d.]+) and at ([\d.]+) the solution has jumped onto the clustered branch "
                  r"\(\|μ̂₁\| = ([\d.]+)\)",
                  text)
    assert m, "the prose of the sweep up"
    last = at[float(m[1])]
    assert np.all(up[: last + 1] <= 1e-3) and up[last + 1] > 1e-3, up
    assert at[float(m[2])] == last + 1 and _rounds_to(m[3], up[last + 1]), (m[3], up[last + 1])
    assert at[float(m[4])] == last + 2 and _rounds_to(m[5], up[last + 2]), (m[5], up[last + 2])
    d = re.search(r"Going down, the clustered state stays on its branch to K = ([\d.]+), .* at ([\d.]+), below the "
                  r"fold, it is still on its way down after depth (\d+) \(\|μ̂₁\| = ([\d.]+):.* and at ([\d.]+) it is "
                  r"uniform", text)
    assert d, "the prose of the sweep down"
    low = at[float(d[1])]
    assert np.all(down[low:] > 0.3) and float(d[3]) == sweep["depth"], down  # on the clustered branch (|μ̂₁| ≈ 0.5–0.8)
    assert at[float(d[2])] == low - 1 and _rounds_to(d[4], down[low - 1]) and 1e-3 < down[low - 1] < 0.3
    assert at[float(d[5])] == low - 2 and np.all(down[: low - 1] <= 1e-3), down


def test_the_continuation_benchmarks_deterministic_columns_are_regenerated():
    """docs/benchmarks.md, *Locating a phase transition* (`python bench/bench_continuation.py`), and its summary in
    docs/phase_transitions.md: the continuation rows' K_c, relative error (round-off compared as round-off), points,
    and the whole diagram's points and Newton iterations, and the fit bias row (the fit on the exact stationary
    |μ̂₁|²), by the script's `continuation` and `exact_fit_bias` (a CPU second; the scan and the particles take
    minutes and are the script's output; the CPU times are not compared)."""
    bc = _bench("bench_continuation")
    page = (DOCS / "benchmarks.md").read_text()
    for n in (41, 63):
        c = bc.continuation(n)
        m = re.search(rf"^\| continuation, N = {n} \| ([\d.]+) \| ([^|]+) \| [\d.]+ \| (\d+) points; whole diagram: "
                      rf"(\d+) points, (\d+) Newton iterations", page, re.M)
        assert m and m[1] == f"{c['K_c']:.15g}", (n, m, c)
        assert (m[2].strip() == "0" or _num(m[2]) < 1e-15) and c["rel_error"] < 1e-15, (n, m[2], c["rel_error"])
        assert (int(m[3]), int(m[4]), int(m[5])) == (c["branch_points"], c["diagram_points"],
                                                     c["diagram_newton_iterations"]), (n, m.groups(), c)
    e = bc.exact_fit_bias()
    m = re.search(r"^\| fit bias \(the fit on the exact stationary \\\|μ̂₁\\\|²\) \| ([\d.]+) \| ([^|]+) \|", page, re.M)
    assert m and _rounds_to(m[1], e["K_c"]) and _rounds_to(m[2], e["rel_error"]), (m, e)
    phase = _text("phase_transitions.md")
    assert f"the fit of |μ̂₁|² is itself off by {m[2].strip()} on a grid 1–5 % above K_c" in phase


def test_the_free_energy_pages_digits_prose_follows_from_its_table():
    """docs/free_energy.md, *The digits problem*: the Θ-mesh error of F*_h (8×8 against 16×16 cells at λ = 0.1),
    absolute and relative, from the table's F*_h (the table is `python bench/bench_free_energy_digits.py`'s, about
    two CPU minutes, not rerun here)."""
    page = (DOCS / "free_energy.md").read_text()
    f = {c: float(v) for c, v in re.findall(r"^\| 0\.1, (\d+)×\d+ \| ([\d.]+) \|", page, re.M)}
    diff = f["16"] - f["8"]
    text = _text("free_energy.md")
    assert f"F*_h on 8×8 cells lies {diff:.2e} below F*_h on 16×16".replace("e-0", "e-") in text, diff
    assert f"the coarse mesh's minimum ({diff / f['16']:.0e} relative)".replace("e-0", "e-") in text


@pytest.mark.serial
def test_the_main_job_tables_final_risk_of_the_deep_digits_is_regenerated(tempdir):
    """docs/benchmarks.md, *Main job*: the final risk of `demos/digits_deep.toml` (30 steps) that every row of the
    table states, as `python bench/bench_run.py --config demos/digits_deep.toml` runs it (fields and plots off,
    which do not change it; about 25 CPU s), to the digits printed."""
    import json

    from mfpde.cli import main

    out = tempdir / "digits_deep"
    assert main(["run", str(ROOT / "demos" / "digits_deep.toml"), "--out", str(out), "--quiet", "--set",
                 "output.fields=false", "--set", "output.plots=false"]) == 0
    risk = json.loads((out / "report.json").read_text())["final"]["risk"]
    rows = re.findall(r"^\| [12] \| (?:empty|warm) \| .* \| ([\d.]+) \|$", (DOCS / "benchmarks.md").read_text(), re.M)
    assert len(rows) == 3 and all(_rounds_to(r, risk) for r in rows), (rows, risk)
