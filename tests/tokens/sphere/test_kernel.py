"""The sphere's kernels (mfpde.tokens.sphere.kernel) and fast harmonics against independent references.

References: scipy's complex ``sph_harm_y`` (values and derivatives), the O(n²) ``DirectVelocity``, the Funk–
Hecke eigenvalues 4π i_ℓ(β) (``scipy.special.spherical_in``), a Gauss–Legendre × uniform quadrature.
Thresholds: the Bessel tail of the truncated series (:func:`harmonic_tail`) plus round-off γ_k (Higham, via
tests/roundoff.py) of the operation count, times the scale ‖μ‖ e^β of the series' terms (the bound of the
verify check, :func:`mfpde.verify.sphere_kernel.velocity_bound`, derived there).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from mpi4py import MPI  # noqa: F401  (import order)

import numpy as np
import pytest
import scipy.special
from roundoff import gamma

from mfpde.tokens.sphere.harmonics import analysis, real_harmonics, synthesis
from mfpde.tokens.sphere.kernel import (
    EPS,
    HarmonicVelocity,
    LogDomainVelocity,
    choose_kernel,
    direct_limit,
    harmonic_degree,
    harmonic_tail,
    sphere_velocity,
)
from mfpde.tokens.sphere.tilted import TiltedVelocity, fibonacci_centres, tilt_radius
from mfpde.tokens.sphere.velocity import DirectVelocity
from mfpde.verify.sphere_kernel import velocity_bound

ROOT = Path(__file__).resolve().parents[3]


def random_points(n: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).normal(size=(n, 3))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def smooth_measure(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """n random points with masses of a smooth positive density (total mass 1)."""
    y = random_points(n, seed)
    w = np.exp(1.5 * y[:, 0] - y[:, 1] * y[:, 2] + 0.5 * y[:, 2] ** 2)
    return y, w / w.sum()


def gauss_sphere(degree: int) -> tuple[np.ndarray, np.ndarray]:
    """A Gauss–Legendre (in z) × uniform (in φ) rule exact for polynomials of the given degree on S²."""
    z, wz = np.polynomial.legendre.leggauss(degree // 2 + 1)
    nphi = degree + 1
    phi = 2 * np.pi * np.arange(nphi) / nphi
    zz, pp = np.meshgrid(z, phi, indexing="ij")
    s = np.sqrt(1 - zz**2)
    x = np.stack([s * np.cos(pp), s * np.sin(pp), zz], axis=-1).reshape(-1, 3)
    return x, (wz[:, None] * np.full(nphi, 2 * np.pi / nphi)).ravel()


def scipy_real(ll: int, m: int, x: np.ndarray, gradient: bool = False):
    """Y_ℓm (the documented convention) from scipy's complex harmonics, and ∇_S Y_ℓm = ∂_ϑY e_ϑ + ∂_φY/sinϑ e_φ."""
    th = np.arccos(np.clip(x[:, 2], -1, 1))
    ph = np.arctan2(x[:, 1], x[:, 0])
    res = scipy.special.sph_harm_y(ll, abs(m), th, ph, diff_n=1 if gradient else 0)
    y, d = (res[0], res[1]) if gradient else (res, None)
    pick = (lambda z: z.real) if m == 0 else (
        (lambda z: np.sqrt(2) * (-1) ** m * z.real) if m > 0 else (lambda z: np.sqrt(2) * (-1) ** m * z.imag))
    if not gradient:
        return pick(y)
    e_th = np.stack([np.cos(th) * np.cos(ph), np.cos(th) * np.sin(ph), -np.sin(th)], axis=1)
    e_ph = np.stack([-np.sin(ph), np.cos(ph), np.zeros_like(ph)], axis=1)
    return pick(y), pick(d[:, 0])[:, None] * e_th + (pick(d[:, 1]) / np.sin(th))[:, None] * e_ph


def test_harmonic_degree_matches_theory():
    """Theory §9: the tail Σ_{ℓ>L}(2ℓ+1) i_ℓ(β) < 1e-12 e^β at L ≈ 20, 25, 32 for β = 5, 9, 16."""
    for beta, L in [(5.0, 20), (9.0, 25), (16.0, 32)]:
        assert harmonic_degree(beta, 1e-12) == L
        ll = np.arange(L + 1, 400)
        direct = np.sum((2 * ll + 1) * scipy.special.spherical_in(ll, beta)) * np.exp(-beta)
        assert harmonic_tail(beta, L) == pytest.approx(direct, rel=1e-10)
        assert harmonic_tail(beta, L - 1) > 1e-12 >= harmonic_tail(beta, L)


def test_fast_harmonics_against_scipy():
    """The recurrence's Y_ℓm equal scipy's (the documented convention) at random points and the poles."""
    x = np.concatenate([random_points(300, 1), [[0, 0, 1.0], [0, 0, -1.0]]])
    L = 24
    Y = real_harmonics(L, x)
    for ll in range(L + 1):
        for m in range(-ll, ll + 1):
            assert np.abs(Y[:, ll * ll + ll + m] - scipy_real(ll, m, x)).max() < gamma(8 * L) * np.sqrt(
                (2 * ll + 1) / (4 * np.pi)) * 10, (ll, m)


def test_fast_harmonics_orthonormal():
    """Σ_j ω_j Y_k(x_j) Y_k'(x_j) = δ_kk' on a rule exact to degree 2L (sum of n terms of size ≤ (2L+1)/4π)."""
    L = 20
    x, w = gauss_sphere(2 * L)
    Y = real_harmonics(L, x)
    G = Y.T @ (w[:, None] * Y)
    bound = gamma(len(w) + 8 * L) * 4 * np.pi * (2 * L + 1) / (4 * np.pi)
    assert np.abs(G - np.eye((L + 1) ** 2)).max() < bound


def test_analysis_and_gradient_against_scipy():
    """analysis = Yᵀw; synthesis's surface gradient = the gradient of scipy's harmonics (tangent, exact form)."""
    x, L = random_points(400, 2), 12
    rng = np.random.default_rng(3)
    w, g = rng.random(len(x)), rng.normal(size=(L + 1) ** 2)
    ref = np.zeros(len(x))
    grad_ref = np.zeros((len(x), 3))
    for ll in range(L + 1):
        for m in range(-ll, ll + 1):
            y, d = scipy_real(ll, m, x, gradient=True)
            ref += g[ll * ll + ll + m] * y
            grad_ref += g[ll * ll + ll + m] * d
    f, grad = synthesis(L, g, x, gradient=True)
    scale = np.abs(g).sum() * (2 * L + 1) * L
    assert np.abs(f - ref).max() < gamma(8 * (L + 1) ** 2) * scale
    assert np.abs(grad - grad_ref).max() < gamma(8 * (L + 1) ** 2) * scale
    assert np.abs(np.einsum("ij,ij->i", grad, x)).max() < gamma(8) * np.abs(grad).max()
    assert np.abs(analysis(L, x, w) - real_harmonics(L, x).T @ w).max() < gamma(len(x) + 8 * L) * w.sum() * L


@pytest.mark.parametrize("attention", ["unnormalised", "softmax"])
@pytest.mark.parametrize("beta", [1.0, 5.0, 9.0])
def test_harmonic_matches_direct_sum(beta, attention):
    """HarmonicVelocity = DirectVelocity within the tail + round-off bound, on a smooth measure."""
    y, w = smooth_measure(2000, 4)
    x = random_points(300, 5)
    h, d = HarmonicVelocity(beta, attention, c=0.7), DirectVelocity(beta, attention, c=0.7)
    h.update(y, w)
    d.update(y, w)
    phi = np.exp(beta * x @ y.T) @ w
    err = np.linalg.norm(h.velocity(x) - d.velocity(x), axis=1)
    assert np.all(err < velocity_bound(h, x, y, w))
    assert np.abs(h.potential(x) - phi).max() < np.exp(beta) * (harmonic_tail(beta, h.L)
                                                               + gamma(len(y) + 4 * (h.L + 1) ** 2))
    assert h.kernel == "harmonic" and h.coefficients.shape == ((h.L + 1) ** 2,)
    assert h.degree_power().shape == (h.L + 1,)
    assert h.degree_power()[0] == pytest.approx(1 / (4 * np.pi))  # μ̂_00 = ‖μ‖ Y_00


@pytest.mark.parametrize("attention", ["unnormalised", "softmax"])
@pytest.mark.parametrize(("ll", "m"), [(1, 0), (3, -2), (6, 5)])
def test_funk_hecke_mode(ll, m, attention):
    """μ = 1/4π + ε Y_ℓm (an exact quadrature): v = c β⁻¹ 4π ε i_ℓ ∇_S Y_ℓm (÷ i_0(β) + 4π ε i_ℓ Y_ℓm for SA)."""
    beta, eps, c = 6.0, 1e-3, 1.3
    h = HarmonicVelocity(beta, attention, c=c)
    x, wq = gauss_sphere(h.L + ll)
    w = wq * (1 / (4 * np.pi) + eps * scipy_real(ll, m, x))
    h.update(x, w)
    assert h.degree_power()[ll] == pytest.approx(eps**2, rel=gamma(len(w)) * 1e3 / eps)
    t = random_points(200, 6)
    y, dy = scipy_real(ll, m, t, gradient=True)
    i_l, i_0 = scipy.special.spherical_in([ll, 0], beta)
    v = c / beta * 4 * np.pi * eps * i_l * dy
    if attention == "softmax":
        v /= (i_0 + 4 * np.pi * eps * i_l * y)[:, None]
        np.testing.assert_allclose(v, c * eps * 4 * np.pi * i_l / (beta * i_0) * dy, atol=c * (eps * 4 * np.pi) ** 2)
    bound = velocity_bound(h, t, x, w)
    assert np.all(np.linalg.norm(h.velocity(t) - v, axis=1) < bound)


def test_log_domain_kernel_where_harmonic_fails():
    """SA at β = 20 on a cluster: the harmonic quotient is wrong far from the mass, the log-domain one is not."""
    beta = 20.0
    y = np.array([[0.0, 0.0, 1.0], [0.0, 0.1, 0.995], [0.05, 0.0, 0.999]])
    y /= np.linalg.norm(y, axis=1, keepdims=True)
    w = np.array([0.5, 0.3, 0.2])
    x = np.concatenate([[[0.0, 0.6, -0.8], [0.3, 0.0, -0.95]], random_points(100, 7)])
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    d, h, lg, tl = (cls(beta, "softmax") for cls in (DirectVelocity, HarmonicVelocity, LogDomainVelocity,
                                                      TiltedVelocity))
    for k in (d, h, lg, tl):
        k.update(y, w)
    ref = d.velocity(x)
    # the softmax weights carry γ_k of the exponents ≤ 2β (tests/roundoff.softmax_error's reasoning)
    bound = gamma(len(y) + 8) * 2 * beta * np.abs(ref).max()
    assert np.abs(lg.velocity(x) - ref).max() < bound
    assert np.abs(h.velocity(x) - ref).max() > 1e-3  # ε e^{2β} ≈ 5e+1: the harmonic series is useless here
    assert np.all(np.linalg.norm(tl.velocity(x) - ref, axis=1) < velocity_bound(tl, x, y, w) + bound)
    assert choose_kernel(beta, "softmax") == "tilted" == sphere_velocity(beta, "softmax").kernel
    assert lg.degree_power()[0] == pytest.approx(1 / (4 * np.pi))
    np.testing.assert_allclose(lg.potential(x), np.exp(beta * x @ y.T) @ w, rtol=gamma(8) * 2 * beta)


def test_log_domain_usa_and_zero_masses():
    """USA by the log-domain kernel = the direct sum; points of zero mass (log w = −∞) drop out, small negative
    masses (a DG density's round-off) keep their sign, in the log-domain and the tilted kernels."""
    y, w = smooth_measure(500, 8)
    w[::3] = 0.0
    w[1::7] *= -1e-3
    x = random_points(50, 9)
    d, lg = DirectVelocity(7.0, "unnormalised"), LogDomainVelocity(7.0, "unnormalised")
    d.update(y, w)
    lg.update(y, w)
    ref = d.velocity(x)
    assert np.abs(lg.velocity(x) - ref).max() < gamma(len(y) + 16) * 7 * np.exp(7.0)
    d, tl = DirectVelocity(30.0, "softmax"), TiltedVelocity(30.0, "softmax", rtol=1e-6)
    d.update(y, w)
    tl.update(y, w)
    ref = d.velocity(x)
    assert np.all(np.linalg.norm(tl.velocity(x) - ref, axis=1) < 2e-6 * (1 + np.linalg.norm(ref, axis=1)))


@pytest.mark.parametrize("attention", ["unnormalised", "softmax"])
@pytest.mark.parametrize("beta", [12.0, 40.0])
def test_tilted_matches_direct_sum(beta, attention):
    """TiltedVelocity = the direct sum within its bound (e^{2βr} to the nearest centre), smooth and clustered."""
    x = random_points(300, 12)
    for y, w in (smooth_measure(1500, 13), (random_points(3, 14) * 0.1 + [0, 0, 1], np.array([0.5, 0.3, 0.2]))):
        y = y / np.linalg.norm(y, axis=1, keepdims=True)
        t, d = TiltedVelocity(beta, attention, c=0.7), DirectVelocity(beta, attention, c=0.7)
        t.update(y, w)
        d.update(y, w)
        ref = d.velocity(x)
        direct_err = gamma(len(y) + 8) * 2 * beta * np.linalg.norm(ref, axis=1)  # the reference's own round-off
        assert np.all(np.linalg.norm(t.velocity(x) - ref, axis=1) < velocity_bound(t, x, y, w) + direct_err)
        np.testing.assert_allclose(t.potential(x), np.exp(beta * x @ y.T) @ w, rtol=1e-6)
        assert t.kernel == "tilted" and t.degree_power()[0] == pytest.approx(1 / (4 * np.pi))


def test_tilt_centres_cover_the_sphere():
    """Every point of a dense random sample lies within r_max (chord) of a centre, for β r_max = ρ at 1e-6."""
    x = random_points(20000, 15)
    for beta in (12.0, 20.0, 40.0):
        r_max = tilt_radius(1e-6) / beta
        a = fibonacci_centres(r_max)
        assert np.sqrt(2 - 2 * (x @ a.T).max(axis=1)).max() < r_max


def test_choose_kernel_rule():
    """USA always harmonic; SA harmonic while 4 ε e^{2β} ≤ rtol, so at β = ½ log(rtol/4ε) ± 0.01."""
    for beta in (1.0, 15.0, 60.0):
        assert choose_kernel(beta, "unnormalised") == "harmonic"
    b = 0.5 * np.log(1e-6 / (4 * EPS))
    assert choose_kernel(b - 0.01, "softmax") == "harmonic"
    assert choose_kernel(b + 0.01, "softmax") == "tilted"
    assert sphere_velocity(5.0, "softmax", kernel="log-domain").kernel == "log-domain"
    assert sphere_velocity(5.0, "softmax", kernel="tilted").kernel == "tilted"
    with pytest.raises(ValueError, match="kernel"):
        sphere_velocity(5.0, "softmax", kernel="fft")
    with pytest.raises(ValueError, match="attention"):
        choose_kernel(5.0, "hard")


@pytest.mark.parametrize("sht", ["numpy", "ducc0"])
def test_few_points_take_the_direct_sum_with_the_same_velocity(monkeypatch, sht):
    """Told n points, choose_kernel takes the direct sum up to direct_limit(L) and the harmonic series above it, for
    either transform backend, and the direct sum at any n where the series would be the tilted one; the direct
    velocity equals the harmonic one to the series' round-off and Bessel tail."""
    if sht == "ducc0":
        pytest.importorskip("ducc0")
    monkeypatch.setenv("MFPDE_SHT", sht)
    for beta, attention in ((5.0, "unnormalised"), (9.0, "softmax"), (20.0, "softmax")):
        limit = direct_limit(harmonic_degree(beta), sht)
        assert 64 < limit <= 1600
        assert choose_kernel(beta, attention, points=limit) == "direct"
        series = choose_kernel(beta, attention)
        assert choose_kernel(beta, attention, points=limit + 1) == ("direct" if series == "tilted" else series)
        assert choose_kernel(beta, attention, points=20000) == ("direct" if series == "tilted" else series)
        assert choose_kernel(beta, attention, points=None) == series
    assert direct_limit(22, "numpy") == 529 and direct_limit(55, "numpy") == 1600 and direct_limit(22, "ducc0") == 492
    x = random_points(300, 3)
    w = np.exp(x[:, 0]) / np.exp(x[:, 0]).sum()
    for attention in ("unnormalised", "softmax"):
        d = sphere_velocity(5.0, attention, points=300)
        h = sphere_velocity(5.0, attention, kernel="harmonic")
        assert d.kernel == "direct" and h.kernel == "harmonic"
        for k in (d, h):
            k.update(x, w)
        gap = np.linalg.norm(d.velocity(x) - h.velocity(x), axis=1)
        assert np.all(gap <= velocity_bound(h, x, x, w)), gap.max()


MPI_SCRIPT = """
import sys
import numpy as np
from mpi4py import MPI
from mfpde.tokens.sphere.kernel import sphere_velocity
from mfpde.verify.sphere_kernel import velocity_bound
comm = MPI.COMM_WORLD
rng = np.random.default_rng(11)
y = rng.normal(size=(1500, 3)); y /= np.linalg.norm(y, axis=1, keepdims=True)
w = np.exp(y[:, 0] + y[:, 2] ** 2); w /= w.sum()
x = rng.normal(size=(64, 3)); x /= np.linalg.norm(x, axis=1, keepdims=True)
mine = np.array_split(np.arange(len(y)), comm.size)[comm.rank][::-1]  # uneven, reversed: any partition
out = {}
for beta, att in [(5.0, "unnormalised"), (8.0, "softmax"), (20.0, "softmax")]:
    k = sphere_velocity(beta, att, comm)
    k.update(y[mine], w[mine])
    v = k.velocity(x)
    allv = comm.allgather(v)
    assert all(np.array_equal(v, u) for u in allv), "ranks disagree"
    out[f"{beta}-{att}-v"], out[f"{beta}-{att}-c"] = v, k.coefficients
    out[f"{beta}-{att}-b"] = velocity_bound(k, x, y, w)
if comm.rank == 0:
    np.savez(sys.argv[1], **out)
"""


@pytest.mark.serial
def test_one_two_three_ranks_agree(tmp_path):
    """Coefficients and velocities on 1, 2, 3 ranks (uneven partitions) agree to the reordering of n-term sums."""
    script = tmp_path / "kernel_ranks.py"
    script.write_text(textwrap.dedent(MPI_SCRIPT))
    mpiexec = Path(sys.executable).parent / "mpiexec"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    res = {}
    for n in (1, 2, 3):
        proc = subprocess.Popen([str(mpiexec), "-n", str(n), sys.executable, str(script), str(tmp_path / f"{n}.npz")],
                                env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
        try:
            out, err = proc.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            pytest.fail(f"mpiexec -n {n} hung (killed after 240 s)")
        assert proc.returncode == 0, out + err
        res[n] = dict(np.load(tmp_path / f"{n}.npz"))
    # coefficients: two orders of a sum of 1500 terms w_j Y(x_j), |Y_ℓm| ≤ √((2L+1)/4π), Σ w = 1; velocities:
    # each run within the kernel's bound of the exact velocity (verify.sphere_kernel.velocity_bound)
    for key in res[1]:
        for n in (2, 3):
            a, b = res[1][key], res[n][key]
            if key.endswith("-c"):
                assert np.abs(a - b).max() < 2 * gamma(1500) * np.sqrt((2 * np.sqrt(len(a)) + 1) / (4 * np.pi)), key
            elif key.endswith("-v"):
                assert np.all(np.linalg.norm(a - b, axis=1) < 2 * res[1][key[:-1] + "b"]), key
