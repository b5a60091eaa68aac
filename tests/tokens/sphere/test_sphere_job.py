"""``mfpde transport`` on the sphere: the report of both solvers against closed forms of the data, its fields and
picture, and the same report on any number of ranks."""

from __future__ import annotations

import json
import math

from mpi4py import MPI

import numpy as np
import pytest
from roundoff import gamma

import mfpde.config as C
from mfpde.cli import main
from mfpde.io import read_vtx
from mfpde.jobs.transport import domain_transport as transport_job

DEMO = "demos/sphere.toml"
#: One mode of amplitude a: the initial degree powers are 1/4π at ℓ = 0 and a² at ℓ = 2, 0 elsewhere.
A = 0.05
SMALL = ["tokens.refine=1", "depth.T=1.0", "depth.steps=2", "output.every=1", f"data.modes=[[2, 1, {A}]]"]


def _power0(rep):
    return np.array(rep["harmonics"]["power"][0])


@pytest.mark.serial
def test_flow_report_starts_at_the_data_and_keeps_its_mass(tempdir):
    """The product quadrature of N nodes is exact for degree 2N − 1: the powers of ℓ ≤ 2N − 3 at t = 0 are the
    data's (1/4π at ℓ = 0, a² at ℓ = 2) to round-off; above, the product Y_ℓm μ_0 aliases."""
    out = tempdir / "flow"
    assert main(["transport", DEMO, "--out", str(out), "--quiet", *sum((["--set", s] for s in [
        *SMALL, "tokens.solver='flow'", "tokens.labels=200"]), [])]) == 0
    rep = json.loads((out / "report.json").read_text())["samples"][0]
    p = _power0(rep)
    want = np.zeros_like(p)
    want[0], want[2] = 1 / (4 * math.pi), A * A
    n = rep["labels"]
    assert rep["labels"] == 2 * 10 * 10  # N = ⌈√(200/2)⌉ = 10
    exact = 2 * 10 - 3 + 1
    assert np.abs(p - want)[:exact].max() <= gamma(8 * n) * 4, (p[:4], want[:4])
    # 200 particles are below the direct sum's limit at L = 28 with either transform backend: no series
    assert rep["solver"] == "flow" and rep["kernel"] == "direct" and rep["kernel_degree"] is None
    assert rep["mass_error"] == 0.0
    assert len(rep["t"]) == len(rep["clusters_t"]) == len(rep["harmonics"]["power"]) == 3
    assert rep["solve_cpu_s"] > 0 and rep["integrator"]["explicit_steps"] == rep["substeps"]
    assert (out / "plots" / "sphere_0.png").read_bytes()[:4] == b"\x89PNG"
    mu = read_vtx(out / "fields" / "mu_0.bp")
    assert len(mu.times) == 3


@pytest.mark.serial
def test_dg_report_mass_and_power_of_the_data(tempdir):
    """DG1 on 80 and 320 cells: μ_0 a probability and the mass kept to round-off, μ_h ≥ 0, the degree-2 power of
    the projected data converging to a² (a linear functional of the L2 projection's error: O(h^{2p+2}) = O(h⁴) by
    duality; the fitted order ≥ 3), three fields written."""
    err = []
    for refine in (1, 2):
        out = tempdir / f"dg{refine}"
        assert main(["transport", DEMO, "--out", str(out), "--quiet",
                     *sum((["--set", s] for s in [*SMALL, f"tokens.refine={refine}"]), [])]) == 0
        rep = json.loads((out / "report.json").read_text())["samples"][0]
        assert rep["solver"] == "dg" and rep["cells"] == 20 * 4**refine and rep["degree"] == 1
        assert abs(rep["mass_0"] - 1) <= gamma(4 * rep["cells"])
        assert rep["mass_error"] <= gamma(60 * rep["substeps"] * rep["cells"]), rep["mass_error"]
        assert rep["min_density"] >= 0
        p = _power0(rep)
        assert abs(p[0] * 4 * math.pi - 1) <= gamma(8 * rep["cells"])  # μ̂_00 = ∫ Y_00 dμ = 1/√4π
        err.append(abs(p[2] / (A * A) - 1))
        assert rep["merge_times"] == [] and rep["clusters_T"] == 0  # 1 + a small mode: no cluster by t = 1
        mu = read_vtx(out / "fields" / "mu_0.bp")  # the facets' true areas in R³ (their x–y shadows gave 0.5)
        assert len(mu.times) == 3 and abs(mu.integral(0) - 1) <= gamma(8 * rep["cells"]), mu.integral(0)
        assert abs(mu.integral(2) - rep["mass_T"]) <= gamma(8 * rep["cells"])
    assert math.log2(err[0] / err[1]) >= 3, err


@pytest.mark.ranks
@pytest.mark.parametrize("solver", ["dg", "flow"])
def test_the_report_does_not_depend_on_the_ranks(tempdir, solver):
    """COMM_WORLD against COMM_SELF: the same counts, and the numbers to the round-off of the reordered sums."""
    cfg = C.load(DEMO, [*SMALL, f"tokens.solver='{solver}'", "tokens.labels=128", "output.fields=false",
                        "output.plots=false"])
    comm = MPI.COMM_WORLD
    world = transport_job(cfg, tempdir / "world", comm)["samples"][0]
    alone = transport_job(cfg, tempdir / f"self{comm.rank}", MPI.COMM_SELF)["samples"][0]
    for key in ("substeps", "clusters_t", "t", "merge_times", "kernel", "solver"):
        assert world[key] == alone[key], key
    pw, pa = np.array(world["harmonics"]["power"]), np.array(alone["harmonics"]["power"])
    assert np.abs(pw - pa).max() <= 1e-12 * pa.max()
    assert abs(world["mass_T"] - alone["mass_T"]) <= 1e-13


@pytest.mark.ranks
def test_noisy_transport_reports_a_decreasing_free_energy_on_any_ranks(tempdir):
    """``tokens.noise`` > 0 (DG0, the Scharfetter–Gummel flux): ``noise`` and ``free_energy_t`` at every output depth,
    E decreasing (K = 1 below the fold: the flow relaxes to the uniform state), μ ≥ 0, the mass to round-off, and
    the same numbers on COMM_WORLD and COMM_SELF to the round-off of the reordered sums."""
    from roundoff import conservation, reordered

    cfg = C.load("demos/noisy_sphere.toml", ["tokens.refine=1", "depth.T=0.5", "depth.steps=4", "output.every=1",
                                             "output.fields=false", "output.plots=false"])
    comm = MPI.COMM_WORLD
    world = transport_job(cfg, tempdir / "world", comm)["samples"][0]
    alone = transport_job(cfg, tempdir / f"self{comm.rank}", MPI.COMM_SELF)["samples"][0]
    E = np.array(world["free_energy_t"])
    assert world["noise"] == 1.0 and world["degree"] == 0 and len(E) == len(world["t"]) == 5
    assert np.all(np.diff(E) < 0) and world["min_density"] >= 0
    assert world["mass_error"] <= conservation(3 * world["substeps"], 40, 80), world["mass_error"]
    assert world["substeps"] == alone["substeps"]
    # E's terms: the entropy (≤ τ(|E| + 1)) and the interaction (≤ (K/2β) e^β): their sums reordered, per sub-step
    scale = 2 * (np.abs(E).max() + 1.0) + math.exp(3.0) / 6.0
    assert np.abs(E - np.array(alone["free_energy_t"])).max() <= 3 * world["substeps"] * reordered(240, scale)


@pytest.mark.serial
@pytest.mark.parametrize("override", ["tokens.degree=1", "tokens.solver='flow'"])
def test_noise_needs_dg0(tempdir, override):
    """Noise with DG1 or the flow solver: exit 2, one line naming tokens.noise, nothing written."""
    out = tempdir / "o"
    assert main(["transport", "demos/noisy_sphere.toml", "--out", str(out), "--quiet", "--set", override]) == 2
    assert not (out / "report.json").exists()


@pytest.mark.serial
@pytest.mark.parametrize("solver", ["dg", "flow"])
def test_a_head_of_zero_coupling_leaves_mu_where_it_is(tempdir, solver):
    """tokens.coupling = 0: the one head has c = 0, the velocity is zero, μ_T = μ_0 (the powers at T are those at
    0 to round-off) and the report still names the head's kernel."""
    cfg = C.load(DEMO, [*SMALL, f"tokens.solver='{solver}'", "tokens.labels=128", "tokens.beta=5.0",
                        "tokens.coupling=0.0", "output.fields=false", "output.plots=false"])
    rep = transport_job(cfg, tempdir / solver, MPI.COMM_SELF)["samples"][0]
    p = np.array(rep["harmonics"]["power"])
    assert rep["kernel"] in ("direct", "harmonic") and np.abs(p[-1] - p[0]).max() <= 1e-14 * p[0].max()


@pytest.mark.serial
def test_the_report_does_not_depend_on_the_kernel_the_backend_picks(tempdir, monkeypatch):
    """600 particles at β = 9: ducc0's transforms take the harmonic series, numpy's the direct sum (direct_limit);
    the reports have the same degrees (the series' L = 28) and the same powers within the integrator's tolerance
    (both follow the same trajectory to rtol; the velocities differ by the series' round-off only)."""
    pytest.importorskip("ducc0")
    got = {}
    for sht in ("ducc0", "numpy"):
        monkeypatch.setenv("MFPDE_SHT", sht)
        cfg = C.load(DEMO, [*SMALL, "tokens.solver='flow'", "tokens.labels=600", "output.fields=false",
                            "output.plots=false"])
        got[sht] = transport_job(cfg, tempdir / sht, MPI.COMM_SELF)["samples"][0]
    assert (got["ducc0"]["kernel"], got["numpy"]["kernel"]) == ("harmonic", "direct")
    assert got["ducc0"]["harmonics"]["l"] == got["numpy"]["harmonics"]["l"] == list(range(29))
    p, q = (np.array(got[s]["harmonics"]["power"]) for s in ("ducc0", "numpy"))
    assert np.abs(p - q).max() <= cfg.tokens.rtol * p.max()
