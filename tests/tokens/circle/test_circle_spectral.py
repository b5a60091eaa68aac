"""The circle's spectral discretisation of the stationary states (Fourier coefficients): against the collocation."""

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
from mfpde.continuation import Newton, StepControl
from mfpde.continuation_newton import DenseNewton, dense_newton_options
from mfpde.errors import InputRefused
from mfpde.tokens.bessel import iv_orders, spherical_in_orders
from mfpde.tokens.circle.spectral import CircleSpectral
from mfpde.tokens.circle.stationary import CircleStationary

serial = pytest.mark.skipif(MPI.COMM_WORLD.size > 1, reason="serial")
ROOT = Path(__file__).resolve().parents[3]


def _diagram(P, start: float, stop: float) -> dict:
    return noisy_branches(P, start, stop, StepControl(0.05, 1e-6, 0.25, min(start, stop), max(start, stop), 200),
                          eig_solver="scipy")


@pytest.mark.parametrize("x", [1e-5, 0.3, 2.0, 4.0, 30.0, 700.0])
def test_bessel_recurrence_is_scipy(x):
    """Miller's recurrence: I_k(x) and i_ℓ(x), k, ℓ = 0..5, to a few units of the last place; every order to 1e-12."""
    k = np.arange(40)
    a, b = iv_orders(39, x), sp.iv(k, x)
    c, d = spherical_in_orders(39, x), sp.spherical_in(k, x)
    assert np.abs(a[:6] / b[:6] - 1).max() < 4e-15 and np.abs(c[:6] / d[:6] - 1).max() < 4e-15
    ok, ok2 = b > 1e-300, d > 1e-300
    assert np.abs(a[ok] / b[ok] - 1).max() < 1e-12 and np.abs(c[ok2] / d[ok2] - 1).max() < 1e-12


def test_jacobian_is_exact():
    """∂F/∂c and ∂F/∂K against central differences at a non-uniform state."""
    P = CircleSpectral(31, 2.5, 0.7)
    rng = np.random.default_rng(1)
    u, K, eps = P.uniform(), 1.3, 1e-6
    u[1:6] = 0.05 * rng.standard_normal(5)
    assert_jacobian_exact(P, u, K, eps)


def test_the_same_states_as_the_collocation():
    """At fixed K on the clustered branch: the density of the coefficients is the collocation's state on the same N
    points (the kernel's eigenvalues exact instead of aliased: 1e-13), the same free energy and order parameter."""
    beta, N, K = 4.0, 127, 0.8
    S, C = CircleSpectral(N, beta, 1.0), CircleStationary(N, beta, 1.0)
    row = np.eye(S.m + 1)[S.m]
    vm = sp.iv(np.arange(S.m), 3.0) / (math.pi * sp.iv(0, 3.0))  # a von Mises density's coefficients
    vm[0] /= 2
    xs = DenseNewton(S, S.m).solve(np.concatenate([vm, [K]]), row, K)
    with Newton(C, C.m) as nw:
        xc = nw.solve(np.concatenate([S.density(xs[:-1], K), [K]]), np.eye(C.m + 1)[C.m], K)
    assert xs is not None and xc is not None and S.order_parameter(xs[:-1]) > 0.3
    assert S.m < 30  # the degrees of the kernel above round-off: μ = p(c) follows from them
    assert np.abs(S.density(xs[:-1], K) - xc[:-1]).max() < 1e-13 * xc[:-1].max()
    assert abs(S.free_energy(xs[:-1], K) - C.free_energy(xc[:-1], K)) < 1e-13
    assert abs(S.order_parameter(xs[:-1]) - C.order_parameter(xc[:-1])) < 1e-13
    # the stability: the leading eigenvalues of the symmetric blocks and the collocation's, the translation left out
    vs, ok_s = S.stability(xs[:-1], K, 3)
    vc, ok_c = C.stability(xc[:-1], K, 3, "scipy")
    assert ok_s == ok_c and np.abs(vs.real - vc.real).max() < 1e-9 * np.abs(vc).max()


def test_uniform_spectrum_is_the_closed_form():
    """About 1/2π: K k² I_k(β)/β − τ k², each twice (cosine and sine)."""
    beta, tau, K = 2.5, 0.8, 1.1
    P = CircleSpectral(31, beta, tau)
    k = np.arange(1, 4)
    exact = np.repeat(K * k**2 * sp.iv(k, beta) / beta - tau * k**2, 2)
    vals, _ = P.stability(P.uniform(), K, 6)
    assert np.abs(vals.real - exact).max() < 1e-12


def test_dense_newton_is_snes():
    """numpy's Newton takes SNES's iterates: the same solution and iteration count on the collocation problem."""
    P = CircleStationary(41, 3.0, 1.0)
    row = np.eye(P.m + 1)[P.m]
    x0 = np.concatenate([P.uniform() * (1 + 0.5 * np.cos(P.theta[: P.m])), [1.5]])
    dn = DenseNewton(P, P.m)
    with Newton(P, P.m) as nw:
        a, b = nw.solve(x0, row, 1.5), dn.solve(x0, row, 1.5)
        assert a is not None and b is not None and np.abs(a - b).max() < 1e-13 and nw.its == dn.its > 2
    assert DenseNewton(P, P.m, max_it=0).solve(x0, row, 1.5) is None


def test_petsc_options_of_the_prefix():
    """The dense Newton reads -mfpde_cont_snes_max_it and _atol; SNES's own choices pass; any other is refused."""
    assert dense_newton_options(1e-12, {"PETSC_OPTIONS": "-mfpde_cont_snes_max_it 3 -ksp_type gmres"}) == {
        "atol": 1e-12, "max_it": 3}
    assert dense_newton_options(1e-12, {"PETSC_OPTIONS": "-mfpde_cont_snes_type newtonls -mfpde_cont_eps_nev 3"}) == {
        "atol": 1e-12}
    for bad in ("-mfpde_cont_snes_type bogus", "-mfpde_cont_snes_max_it abc", "-mfpde_cont_snes_atol -1"):
        with pytest.raises(InputRefused, match="PETSC_OPTIONS"):
            dense_newton_options(1e-12, {"PETSC_OPTIONS": bad})


@pytest.mark.parametrize("beta,start,stop", [(4.0, 0.2, 1.0), (2.0, 0.5, 2.5)])
def test_branch_points_folds_and_maxwell_are_the_collocations(beta, start, stop):
    """The diagram of the spectral discretisation against the collocation's on the same points: the same events,
    K_c = τβ/I_1(β) to 1e-13, the other branch points, folds and Maxwell points to 1e-10, the curvatures to 1e-7."""
    spec = _diagram(CircleSpectral(63, beta, 1.0), start, stop)
    coll = _diagram(CircleStationary(63, beta, 1.0), start, stop)
    assert [e["kind"] for e in spec["bifurcations"]] == [e["kind"] for e in coll["bifurcations"]]
    kc = 1.0 * beta / sp.iv(1, beta)
    assert abs(spec["bifurcations"][0]["parameter"] - kc) < 1e-13 * kc
    for s, c in zip(spec["bifurcations"], coll["bifurcations"], strict=True):
        assert abs(s["parameter"] - c["parameter"]) < 1e-10 * c["parameter"], (s, c)
        if "curvature" in s:
            assert abs(s["curvature"] - c["curvature"]) < 1e-7 * max(1.0, abs(c["curvature"]))
    for s, c in zip(spec["branches"], coll["branches"], strict=True):
        assert s["origin"] == c["origin"] and s["stopped"].split(" at ")[0] == c["stopped"].split(" at ")[0]


@serial
def test_the_command_imports_neither_petsc_nor_dolfinx(tmp_path):
    """`mfpde continuation` on the spectral discretisation: no petsc4py, slepc4py, dolfinx, scipy.optimize (and no
    matplotlib without plots); the report is the in-process diagram's."""
    code = ("import sys; from mfpde.cli import main; rc = main(sys.argv[1:]); print(sorted({m.split('.')[0] for m in "
            "sys.modules if m.split('.')[0] in ('petsc4py', 'slepc4py', 'dolfinx', 'ufl', 'ffcx', 'matplotlib')} | "
            "({'scipy.optimize'} & set(sys.modules)))); sys.exit(rc)")
    r = subprocess.run([sys.executable, "-c", code, "continuation", str(ROOT / "demos" / "noisy_circle.toml"), "--out",
                        str(tmp_path / "o"), "--quiet", "--set", "output.plots=false"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "[]", r.stdout
    rep = json.loads((tmp_path / "o" / "report.json").read_text())
    assert [e["kind"] for e in rep["bifurcations"]] == ["subcritical", "fold", "maxwell", "supercritical"]
    assert abs(rep["bifurcations"][0]["parameter"] - 4.0 / sp.iv(1, 4.0)) < 1e-13
    assert math.isclose(rep["bifurcations"][1]["parameter"], 0.38706899595, rel_tol=1e-10)


def test_bench_events_are_the_diagrams():
    """bench_continuation --peer: mfpde's events (K_c, the fold) on both demos are the command's diagram's."""
    sys.path.insert(0, str(ROOT / "bench"))
    import bench_continuation

    for name in ("circle", "sphere"):
        ev = bench_continuation.mfpde_events(name)
        dia = bench_continuation.mfpde_diagram(name)()
        kinds = {e["kind"]: e["parameter"] for e in reversed(dia["bifurcations"])}
        assert ev["K_c"] == kinds["subcritical"] and abs(ev["K_f"] / kinds["fold"] - 1) < 1e-10, (ev, kinds)
        assert ev["unknowns"] < 30
