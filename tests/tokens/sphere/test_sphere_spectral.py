"""The sphere's spectral discretisation of the zonal stationary states (Legendre coefficients): against the
collocation."""

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
from mfpde.continuation_newton import DenseNewton
from mfpde.tokens.sphere.spectral import SphereSpectral
from mfpde.tokens.sphere.stationary import SphereStationary

serial = pytest.mark.skipif(MPI.COMM_WORLD.size > 1, reason="serial")
ROOT = Path(__file__).resolve().parents[3]


def _diagram(P, start: float, stop: float) -> dict:
    return noisy_branches(P, start, stop, StepControl(0.05, 1e-6, 0.25, min(start, stop), max(start, stop), 200),
                          eig_solver="scipy")


def test_jacobian_is_exact():
    """∂F/∂c and ∂F/∂K against central differences at a non-uniform state."""
    P = SphereSpectral(21, 2.5, 0.7)
    rng = np.random.default_rng(1)
    u, K, eps = P.uniform(), 1.3, 1e-6
    u[1:5] = 0.02 * rng.standard_normal(4)
    assert_jacobian_exact(P, u, K, eps)


def test_uniform_spectrum_is_the_closed_form():
    """About 1/4π, zonal perturbations: K ℓ(ℓ+1) i_ℓ(β)/β − τ ℓ(ℓ+1), ℓ = 1..5; the azimuthal verdict τ − K i_m/β."""
    beta, tau, K = 2.5, 0.8, 1.1
    P = SphereSpectral(31, beta, tau)
    ll = np.arange(1, 6)
    exact = K * ll * (ll + 1) * sp.spherical_in(ll, beta) / beta - tau * ll * (ll + 1)
    vals, ok = P.stability(P.uniform(), K, 5)
    assert np.abs(np.sort(vals.real)[::-1] - np.sort(exact)[::-1]).max() < 1e-12 and ok
    Kc = tau * beta / sp.spherical_in(1, beta)
    assert not P.stability(P.uniform(), 1.01 * Kc, 2)[1] and P.stability(P.uniform(), 0.99 * Kc, 2)[1]


def test_the_same_states_as_the_collocation():
    """At fixed K on the clustered branch: the Gibbs density of the coefficients is the collocation's state at the
    same nodes, the same free energy, order parameter and stability."""
    beta, n, K = 3.0, 64, 1.6
    S, C = SphereSpectral(n, beta, 1.0), SphereStationary(n, beta, 1.0)
    ll = np.arange(S.m)
    c0 = (2 * ll + 1) / (4 * math.pi) * sp.spherical_in(ll, 10.0) / sp.spherical_in(0, 10.0)  # von Mises–Fisher
    xs = DenseNewton(S, S.m).solve(np.concatenate([c0, [K]]), np.eye(S.m + 1)[S.m], K)
    assert xs is not None and S.order_parameter(xs[:-1]) > 0.5 and S.m < 30
    with Newton(C, C.m) as nw:
        xc = nw.solve(np.concatenate([S.density(xs[:-1], K), [K]]), np.eye(C.m + 1)[C.m], K)
    assert xc is not None
    assert np.abs(S.density(xs[:-1], K) - xc[:-1]).max() < 1e-11 * xc[:-1].max()
    assert abs(S.free_energy(xs[:-1], K) - C.free_energy(xc[:-1], K)) < 1e-11
    assert abs(S.order_parameter(xs[:-1]) - C.order_parameter(xc[:-1])) < 1e-12
    vs, ok_s = S.stability(xs[:-1], K, 3)
    vc, ok_c = C.stability(xc[:-1], K, 3, "scipy")
    assert ok_s == ok_c and np.abs(vs.real - vc.real).max() < 1e-8 * np.abs(vc).max()


@pytest.mark.parametrize("beta,start,stop", [(3.0, 0.8, 2.0), (1.0, 2.5, 4.5)])
def test_branch_points_folds_and_maxwell_are_the_collocations(beta, start, stop):
    """The diagram against the collocation's on the same nodes: the same events, K_c = τβ/i_1(β) to 1e-13, the
    other branch points, folds and Maxwell points to 1e-10, the curvatures to 1e-7, the same stability verdicts."""
    spec = _diagram(SphereSpectral(64, beta, 1.0), start, stop)
    coll = _diagram(SphereStationary(64, beta, 1.0), start, stop)
    assert [e["kind"] for e in spec["bifurcations"]] == [e["kind"] for e in coll["bifurcations"]]
    kc = 1.0 * beta / sp.spherical_in(1, beta)
    assert abs(spec["bifurcations"][0]["parameter"] - kc) < 1e-13 * kc
    for s, c in zip(spec["bifurcations"], coll["bifurcations"], strict=True):
        assert abs(s["parameter"] - c["parameter"]) < 1e-10 * c["parameter"], (s, c)
        if "curvature" in s:
            assert abs(s["curvature"] - c["curvature"]) < 1e-7 * max(1.0, abs(c["curvature"]))
    for s, c in zip(spec["branches"], coll["branches"], strict=True):
        assert s["origin"] == c["origin"]
        # stable where the collocation is stable, K for K (the points differ: the norms of the steps differ)
        Ks, Kc = np.array(s["parameter"]), np.array(c["parameter"])
        for K, st in zip(Ks, s["stable"], strict=True):
            j = int(np.argmin(np.abs(Kc - K)))
            near = np.abs(Kc - K) < 1e-9
            if near.any():
                assert st == c["stable"][j]


@serial
def test_the_command_on_the_demo(tmp_path):
    """`mfpde continuation demos/noisy_sphere.toml`: K_c, the fold and the Maxwell point, no PETSc imported."""
    code = ("import sys; from mfpde.cli import main; rc = main(sys.argv[1:]); print(sorted({m.split('.')[0] for m in "
            "sys.modules if m.split('.')[0] in ('petsc4py', 'slepc4py', 'dolfinx')})); sys.exit(rc)")
    r = subprocess.run([sys.executable, "-c", code, "continuation", str(ROOT / "demos" / "noisy_sphere.toml"), "--out",
                        str(tmp_path / "o"), "--quiet"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "[]", r.stdout
    rep = json.loads((tmp_path / "o" / "report.json").read_text())
    assert [e["kind"] for e in rep["bifurcations"]] == ["subcritical", "fold", "maxwell"]
    assert abs(rep["bifurcations"][0]["parameter"] / (3.0 / sp.spherical_in(1, 3.0)) - 1) < 1e-13
    assert math.isclose(rep["bifurcations"][1]["parameter"], 1.20844752878034, rel_tol=1e-10)
    assert math.isclose(rep["bifurcations"][2]["parameter"], 1.23374439459629, rel_tol=1e-10)
    assert (tmp_path / "o" / "plots" / "bifurcation.png").exists()
