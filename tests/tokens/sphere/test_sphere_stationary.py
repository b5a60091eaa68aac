"""The zonal stationary states of noisy tokens on S² (theory §10): kernel, Jacobian, spectrum, thresholds, CLI."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

from mpi4py import MPI

import numpy as np
import pytest
import scipy.special as sp
from taylor import assert_jacobian_exact

from mfpde.bifurcation import noisy_branches
from mfpde.continuation import StepControl
from mfpde.tokens.sphere.stationary import SphereStationary

serial = pytest.mark.skipif(MPI.COMM_WORLD.size > 1, reason="serial")
ROOT = Path(__file__).resolve().parents[3]


def _branches(beta: float, start: float, stop: float, points: int = 40) -> dict:
    P = SphereStationary(points, beta, 1.0)
    return noisy_branches(P, start, stop, StepControl(0.05, 1e-6, 0.25, min(start, stop), max(start, stop), 80),
                          eig_solver="scipy")


def test_zonal_kernel_is_funk_hecke():
    """The azimuth-integrated kernel on Legendre polynomials: A P_ℓ = 4π i_ℓ(β) P_ℓ (Funk–Hecke), to round-off."""
    beta = 3.0
    P = SphereStationary(30, beta, 1.0)
    for ll in range(8):
        lam = 4 * math.pi * sp.spherical_in(ll, beta)
        assert np.abs(P.A @ P.V[:, ll] - lam * P.V[:, ll]).max() < 1e-12 * 4 * math.pi * sp.spherical_in(0, beta)
    assert abs(P.q.sum() - 4 * math.pi) < 1e-13  # ∫_{S²} 1 dσ


def test_jacobian_is_exact():
    """∂F/∂u and ∂F/∂K against central differences (error O(ε²) ≈ 1e-10 at ε = 1e-6), and the Taylor remainder
    |F(u + εv) − F(u) − εJv| falling as ε² at a non-uniform state."""
    P = SphereStationary(21, 2.5, 0.7)
    rng = np.random.default_rng(1)
    u, K, eps = P.uniform() * (1 + 0.3 * rng.standard_normal(P.m)), 1.3, 1e-6
    Ju, _ = assert_jacobian_exact(P, u, K, eps)
    v = P.uniform() * rng.standard_normal(P.m)
    rem = [np.linalg.norm(P.residual(u + e * v, K) - P.residual(u, K) - e * Ju @ v) for e in (1e-2, 5e-3)]
    assert abs(math.log2(rem[0] / rem[1]) - 2.0) < 0.1, rem


def test_uniform_spectrum_is_the_closed_form():
    """About 1/4π, zonal perturbations: K ℓ(ℓ+1) i_ℓ(β)/β − τ ℓ(ℓ+1), ℓ = 1..5, by SLEPc and scipy."""
    beta, tau, K = 2.5, 0.8, 1.1
    P = SphereStationary(31, beta, tau)
    ll = np.arange(1, 6)
    exact = K * ll * (ll + 1) * sp.spherical_in(ll, beta) / beta - tau * ll * (ll + 1)
    for solver in ("slepc", "scipy"):
        vals, stable = P.stability(P.uniform(), K, 5, solver)
        assert np.allclose(vals.real, exact, rtol=1e-10) and np.abs(vals.imag).max() < 1e-10, (solver, vals)
        assert stable == bool(exact.max() < 0)
    assert not P.stability(P.uniform(), 1.05 * P.threshold(1), 2, "scipy")[1]


@pytest.mark.parametrize("beta", [1.0, 2.0, 4.0])
def test_threshold_is_tau_beta_over_i1(beta):
    """The first branch point of the uniform branch: K_c = τβ/i_1(β) to 1e-12 relative (Gauss–Legendre: spectral)."""
    kc = beta / sp.spherical_in(1, beta)
    out = _branches(beta, 0.5 * kc, 1.3 * kc)
    first = out["bifurcations"][0]
    assert first["mode"] == 1 and abs(first["parameter"] - kc) < 1e-12 * kc, first
    assert abs(first["closed_form"] - kc) < 1e-14 * kc


def test_supercritical_below_and_subcritical_with_a_fold_above_beta_star():
    """β = 1 < β* = 1.816: c₂ > 0, a stable branch for K > K_c; β = 3 > β*: c₂ < 0, a fold at K_f < K_c, unstable
    between the branch point and the fold, stable beyond the fold."""
    kc1 = 1.0 / sp.spherical_in(1, 1.0)
    sup = _branches(1.0, 0.8 * kc1, 1.3 * kc1)
    b = sup["bifurcations"][0]
    assert b["kind"] == "supercritical" and b["curvature"] > 0
    br = sup["branches"][1]
    assert all(br["stable"][1:]) and min(br["parameter"]) >= b["parameter"] - 1e-12
    sub = _branches(3.0, 0.9, 1.6, points=64)
    assert [e["kind"] for e in sub["bifurcations"] if e["mode"] == 1] == ["subcritical", "fold", "maxwell"], \
        sub["bifurcations"]
    kc, fold, km = (e["parameter"] for e in sub["bifurcations"][:3])
    assert 1.0 < fold < km < kc
    br = sub["branches"][1]
    st, r = np.array(br["stable"]), np.array(br["order_parameter"])
    rf = sub["bifurcations"][1]["order_parameter"]
    assert not st[(r > 0.05) & (r < rf - 0.05)].any() and st[r > rf + 0.05].all()
    assert not sub["branches"][0]["stable"][-1]


def test_the_demo_is_a_valid_continuation_config():
    from mfpde import config as C
    from mfpde.jobs.continuation import check_continuation

    assert check_continuation(C.load(str(ROOT / "demos" / "noisy_sphere.toml"))) == (3.0, 1.0)


@serial
def test_cli_continuation_on_the_sphere(tmp_path):
    """The demo, shrunk: exit 0, the subcritical bifurcation at τβ/i_1(β) and its fold, the diagram."""
    args = [sys.executable, "-m", "mfpde", "continuation", str(ROOT / "demos" / "noisy_sphere.toml"), "--out",
            str(tmp_path / "o"), "--quiet", "--set", "continuation.points=40", "--set", "continuation.stop=1.5"]
    r = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rep = json.loads((tmp_path / "o" / "report.json").read_text())
    assert rep["domain"] == "sphere" and rep["status"] == "ok"
    assert [(e["kind"], e["mode"]) for e in rep["bifurcations"]][:2] == [("subcritical", 1), ("fold", 1)]
    kc = 3.0 / sp.spherical_in(1, 3.0)
    assert abs(rep["bifurcations"][0]["parameter"] - kc) < 1e-12 * kc
    assert (tmp_path / "o" / "plots" / "bifurcation.png").stat().st_size > 1000


@serial
def test_transport_on_the_sphere_refuses_noise_with_dg1(tmp_path):
    """Noise in transport is DG0's (the continuation takes any degree): DG1 exits 2 naming tokens.noise, one line,
    nothing written."""
    args = [sys.executable, "-m", "mfpde", "transport", str(ROOT / "demos" / "noisy_sphere.toml"), "--out",
            str(tmp_path / "o"), "--quiet", "--set", "tokens.degree=1"]
    r = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "tokens.noise" in r.stderr, r.stderr
    assert not (tmp_path / "o" / "report.json").exists()


def test_azimuthal_second_variation():
    """Non-zonal perturbations f(t) cos mφ: about 1/4π the least eigenvalue is τ − K i_m(β)/β; on the stable
    one-cluster branch (β = 3, K = 1.25) the rotation (f = s μ′, eigenvalue 0 to round-off) is the only zero one and is
    left out, all others > 0 (the state is stable against non-zonal perturbations, not only zonal ones)."""
    import scipy.linalg

    from mfpde.continuation import Newton

    P = SphereStationary(40, 2.5, 0.8)
    m = np.arange(1, 6)
    assert np.allclose(P.azimuthal_hessian(P.uniform(), 1.1, 5), 0.8 - 1.1 * sp.spherical_in(m, 2.5) / 2.5,
                       rtol=1e-12)
    P = SphereStationary(48, 3.0, 1.0)
    row = np.zeros(P.m + 1)
    row[-1] = 1.0
    with Newton(P, P.m) as nw:
        x = nw.solve(np.concatenate([(P.uniform() * (1 + 2.5 * P.mode_state(1))).clip(0.005), [1.25]]), row, 1.25)
    assert x is not None and P.order_parameter(x[:-1]) > 0.7
    mu = x[:-1]
    lam = P.azimuthal_hessian(mu, 1.25, 6)
    assert lam.min() > 0.5, lam
    s = np.sqrt(1 - P.t**2)
    rot = s * (P.D @ mu)  # the rotation about the x-axis, order 1
    metric = np.diag(P.q / mu)
    Bm = 2 * math.pi * sp.ive(1, 3.0 * np.outer(s, s)) * np.exp(3.0 * (np.outer(s, s) + np.outer(P.t, P.t)))
    H = metric - 1.25 / 3.0 * np.outer(P.q, P.q) * Bm / (2 * math.pi)
    assert abs(rot @ H @ rot) < 1e-9 * (rot @ metric @ rot)
    assert abs(scipy.linalg.eigh(H, metric, eigvals_only=True)[0]) < 1e-10
    assert P.stability(mu, 1.25, 2, "scipy")[1]


def test_even_degree_bifurcates_transcritically():
    """Degree 2 (P_2 has no symmetry a ↦ −a): the slope dK/da at τβ/i_2(β) is not zero, the bifurcation is
    "transcritical" and both halves of its branch are followed; degree 1 and 3 (odd) have slope 0 (pitchforks)."""
    out = _branches(5.0, 0.55, 0.8, points=64)
    k2 = 5.0 / sp.spherical_in(2, 5.0)
    first = out["bifurcations"][0]
    assert first["kind"] == "transcritical" and first["mode"] == 2 and abs(first["slope"]) > 0.1, first
    assert abs(first["parameter"] - k2) < 1e-12 * k2
    assert [b["origin"] for b in out["branches"][1:3]] == [f"mode 2 at K = {first['parameter']:.6g}",
                                                         f"mode 2 at K = {first['parameter']:.6g}, a < 0"]
    odd = _branches(3.0, 1.2, 1.5)["bifurcations"][0]
    assert odd["mode"] == 1 and abs(odd["slope"]) < 1e-8 and odd["kind"] == "subcritical"


@pytest.mark.parametrize("override,key", [
    ("tokens.noise=-1.0", "tokens.noise"), ("tokens.noise=0.0", "tokens.noise"),
    ("tokens.attention='softmax'", "tokens.attention"), ("continuation.points=8", "continuation.points"),
    ("continuation.stop=0.8", "continuation.stop")])
def test_bad_sphere_continuation_input_names_the_key(override, key):
    """Refused naming the key (exit 2 at the command line); an even number of points is fine on the sphere."""
    from mfpde import config as C
    from mfpde.jobs.continuation import check_continuation

    demo = str(ROOT / "demos" / "noisy_sphere.toml")
    assert check_continuation(C.load(demo, ["continuation.points=64"])) == (3.0, 1.0)
    with pytest.raises(C.ConfigError, match=key.replace(".", r"\.")):
        check_continuation(C.load(demo, [override]))
