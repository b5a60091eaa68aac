"""The benchmarks of bench/ run (shrunk) and hand back consistent numbers; no timing is asserted (issue 12)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from mpi4py import MPI

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import bench_continuation  # noqa: E402
import bench_depth_scheme  # noqa: E402
import bench_langevin  # noqa: E402
import bench_memory  # noqa: E402
import bench_particles  # noqa: E402
import bench_run  # noqa: E402
import bench_threads  # noqa: E402
import bench_training_step  # noqa: E402
import digit_pairs  # noqa: E402

pytestmark = pytest.mark.serial


def test_bench_training_step_shrunk():
    """The gradient of the shrunk default (2 images, 2 depth steps) is finite and its counts are right."""
    row = bench_training_step.measure("d=2 digits", 1, ("data.samples=2", "data.test_samples=2", "depth.steps=2"))
    assert row["samples"] == 2 and row["n_a"] == 17  # 16 Θ cells along a: 17 distinct a
    assert np.all(np.isfinite(row["dR_dc"])) and np.any(np.asarray(row["dR_dc"]) != 0.0)
    assert row["forward_s"] > 0 and row["gradient_s"] > 0 and np.isfinite(row["risk"])


def test_bench_run_shrunk():
    """bench_run.run on a shrunk digits_deep.toml: the training images are counted from the report (one NTK
    eigenvalue per training sample), with data.split too, and the timings are consistent."""
    small = ["tokens.cells=[8, 8]", "heads.cells=[6, 6]", "depth.steps=2", "training.steps=2", "output.every=1"]
    deep = str(Path(__file__).resolve().parents[1] / "demos" / "digits_deep.toml")
    row = bench_run.run(1, False, [*small, "data.samples=3", "data.test_samples=2"], deep)
    assert row["train_images"] == 3 and row["steps"] == 2
    assert 0 < row["startup_s"] < row["total_s"] and row["end_s"] > 0 and row["images_steps_per_s"] > 0
    split = bench_run.run(1, False, [*small, "data.split=0.5", "data.classes=[0, 1]"], deep)
    assert split["train_images"] == 180  # 360 images of 0 and 1 in scikit-learn's digits, half for training


def test_bench_particles_shrunk():
    """PDE and particle errors against the closed form of theory §6.1 shrink with the size (d = 2)."""
    assert MPI.COMM_WORLD.size >= 1
    coarse, fine = bench_particles.pde(2, 1, 8), bench_particles.pde(2, 1, 16)
    assert fine["err_cov"] < coarse["err_cov"] and fine["err_yhat"] < coarse["err_yhat"]
    gh3, gh6 = bench_particles.particles(2, 3, False), bench_particles.particles(2, 6, False)
    assert gh6["err_cov"] < gh3["err_cov"]
    rows = [{"N": n, "err_cov": 1.0 / np.sqrt(n), "time_s": 1e-6 * n**2} for n in (100, 400)]
    text = bench_particles._extrapolate(rows, "err_cov", 1e-3, 2)
    assert text.startswith("1e+06 s") and "N ≈ 1e+06" in text, text  # N = 10⁶: (10⁶/400)² × 0.16 s


def test_bench_langevin_shrunk(tmp_path, monkeypatch):
    """The Langevin heads approach the exact training law of theory §6.2 as H grows; the PDE run finishes."""
    monkeypatch.chdir(tmp_path)
    few, many = bench_langevin.langevin(0.25, 10, seeds=2), bench_langevin.langevin(0.25, 10000, seeds=2)
    assert many["err"] < few["err"], (few, many)
    row = bench_langevin.pde(0.5, 20, 40)
    assert np.isfinite(row["err"]) and row["err"] < 0.1, row
    assert bench_langevin.per_head_cost() > 0


def test_measure_fit_against_least_squares():
    """digit_pairs.measure_fit: inside the ℓ1 ball it is the least-squares solution (numpy's lstsq); on it, the
    constraint holds with equality and the risk is no larger than at the rescaled least-squares solution."""
    rng = np.random.default_rng(3)
    F, b = rng.normal(size=(40, 5)), rng.normal(size=40)
    y = b + F @ np.array([0.3, -0.2, 0.0, 0.1, 0.05]) + 0.01 * rng.normal(size=40)
    c_ls = np.linalg.lstsq(F, y - b, rcond=None)[0]
    c = digit_pairs.measure_fit(b, F, y, 10.0)
    # SLSQP's stationarity to ftol = 1e-12 on a problem with condition number κ(F)²: c to about √ftol·κ
    assert np.allclose(c, c_ls, atol=1e-4 * np.linalg.cond(F)), (c, c_ls)
    vmax = 0.3 * np.abs(c_ls).sum()
    c = digit_pairs.measure_fit(b, F, y, vmax)

    def risk(x):
        return 0.5 * np.mean((b + F @ x - y) ** 2)

    assert abs(np.abs(c).sum() - vmax) <= 1e-8 * vmax and risk(c) <= risk(0.3 * c_ls) + 1e-12
    assert np.array_equal(digit_pairs.measure_fit(b, F, y, 0.0), np.zeros(5)) or np.abs(
        digit_pairs.measure_fit(b, F, y, 0.0)).sum() <= 1e-12


def test_bench_threads_settings_give_the_same_run():
    """bench_threads: 1 or 2 BLAS threads and any batch size train the same ρ (the same final risk to 1e-12);
    the busy process of the loaded rows is gone after its block."""
    base = bench_threads.one_run("1", 8, 1)
    for threads, batch in (("2", 8), ("default", 4)):
        wall, risk = bench_threads.one_run(threads, batch, 1)
        assert wall > 0 and risk == pytest.approx(base[1], rel=1e-12), (threads, batch)
    assert bench_threads.one_run("1", 8, 2)[1] != base[1]  # the steps do reach the run
    with bench_threads.Busy() as busy:
        assert busy.proc.poll() is None
    assert busy.proc.poll() is not None


def test_bench_continuation_shrunk():
    """bench_continuation: the continuation's K_c is the closed form to round-off, the particles' Fourier force is
    the kernel e^{β cos ψ} sin ψ, the fit on the exact stationary |μ̂₁|² is off K_c by less than 2e-3 (its stated
    bias, 1.6e-3), and a tiny particle run returns a finite estimate."""
    c = bench_continuation.continuation(41)
    assert c["rel_error"] < 1e-12 and c["branch_points"] > 1
    psi = np.linspace(-np.pi, np.pi, 101)
    coef = bench_continuation._force_coefficients(bench_continuation.BETA)
    series = sum(a * np.sin((k + 1) * psi) for k, a in enumerate(coef))
    exact = np.exp(bench_continuation.BETA * np.cos(psi)) * np.sin(psi)
    assert np.abs(series - exact).max() < 1e-9 * np.abs(exact).max()
    assert bench_continuation.exact_fit_bias(41)["rel_error"] < 2e-3
    p = bench_continuation.particles(200, 0, 0.2, 0.2, 0.05)
    assert np.isfinite(p["cpu_s"]) and len(p["r2"]) == len(bench_continuation.GRID)


def test_bench_memory_shrunk():
    """bench_memory on 8² and 12² token cells (2 depth steps): peaks of fresh processes, a tape report from `run`,
    and the growth per token dof from them."""
    root = Path(bench_memory.__file__).resolve().parents[1]
    rows = [bench_memory.measure(root, n, kind, ["depth.steps=2", "heads.cells=[6, 6]"])
            for n in (8, 12) for kind in ("run", "gradient")]
    assert all(r["peak_bytes"] > 10 * 2**20 for r in rows), rows  # a Python with dolfinx: tens of MB at least
    run = [r for r in rows if r["kind"] == "run"]
    assert all(r["tape"]["substeps"] >= 2 and r["tape"]["segments"] == 0 for r in run), run  # the whole tape fits
    assert np.isfinite(bench_memory.per_dof(rows, "gradient"))


def test_bench_depth_scheme_shrunk():
    """bench_depth_scheme.measure on 8² cells: a finite risk within the schemes' round-off and order of each other."""
    a, b = (bench_depth_scheme.measure(8, s, 1) for s in ("ssp_rk3", "ssp_rk4_10"))
    assert a["substeps"] >= 8 and b["substeps"] >= 8 and a["gradient_cpu_s"] > 0
    assert np.isfinite(a["risk"]) and abs(a["risk"] - b["risk"]) < 1e-3 * abs(a["risk"])


def test_digit_pairs_regenerates_the_screen_of_the_docs(tmp_path):
    """`python bench/digit_pairs.py` (here the rows of docs/digits.md's training table, horizontal readout): the
    pixels, mean-sign and first-order-bound columns of the page, to the digits printed."""
    import re

    text = (Path(__file__).resolve().parents[1] / "docs" / "digits.md").read_text()
    table = re.findall(r"^\| \**(\d) vs (\d)\** \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|", text, re.M)
    assert len(table) >= 5, table
    pairs = [f"{a},{b}" for a, b, *_ in table]
    rows = digit_pairs.main(["--readouts", "horizontal", "--pairs", *pairs, "--out", str(tmp_path / "s.json")])
    got = {f"{r['pair'][0]},{r['pair'][1]}": (f"{r['pixels']:.3f}", f"{r['mean_sign']:.3f}", f"{r['constrained']:.3f}")
           for r in rows}
    for a, b, *cols in table:
        assert got[f"{a},{b}"] == tuple(cols), (a, b, got[f"{a},{b}"], cols)
    quick = digit_pairs.main(["--quick", "--out", str(tmp_path / "q.json")])
    assert [(r["pair"], r["readout"]) for r in quick] == [([0, 6], "horizontal")]


def test_phase_diagrams_smoke_regenerates_the_threshold_table(tmp_path):
    """`python bench/phase_diagrams.py --smoke`: the figures land under --out (never in docs/), and the measured
    thresholds and folds of docs/phase_transitions.md's table (docs/_static/phase_thresholds.md, which the script
    writes with --write-docs) are the run's (the sweep is shortened: its numbers are not in the table);
    --write-docs is refused with --smoke."""
    import json
    import re

    import phase_diagrams

    with pytest.raises(SystemExit):
        phase_diagrams.main(["--smoke", "--write-docs"])
    assert phase_diagrams.main(["--smoke", "--out", str(tmp_path)]) == 0
    assert {p.name for p in tmp_path.glob("*.png")} == {"phase_circle.png", "phase_sphere.png", "phase_hysteresis.png"}
    res = json.loads((tmp_path / "phase_diagrams.json").read_text())
    docs = Path(__file__).resolve().parents[1] / "docs"
    assert "```{include} _static/phase_thresholds.md" in (docs / "phase_transitions.md").read_text()
    text = (docs / "_static" / "phase_thresholds.md").read_text()  # written by --write-docs, included by the page
    assert (tmp_path / "phase_thresholds.md").read_text().splitlines()[:2] == text.splitlines()[:2]
    rows = re.findall(r"^\| K_c, (\w+) \| ([\d.]+) \| ([\d.]+) \| (?:.*= )?([\d.]+) \| .*? \| ([\d.]+) \| 2 \|$",
                      text, re.M)
    assert len(rows) == len(res["thresholds"]["K_c"]) == 7, rows
    for (domain, beta, kc, ref, sharp), r in zip(rows, res["thresholds"]["K_c"], strict=True):
        assert (domain, float(beta)) == (r["domain"], r["beta"])
        assert float(kc) == pytest.approx(r["K_c"], rel=5e-14) and float(ref) == pytest.approx(r["closed_form"],
                                                                                             rel=5e-15)
        assert sharp == f"{r['K_sharp_MR']:.10g}"
    stars = re.findall(r"^\| β\*, (\w+) \(N = (\d+)\) \| \| ([\d.]+) \| .*: ([\d.]+) \|", text, re.M)
    assert len(stars) == 2, stars
    for (domain, n, got, ref), s in zip(stars, res["thresholds"]["beta_star"], strict=True):
        assert (domain, int(n), ref) == (s["domain"], s["points"], f"{s['closed_form']:.10f}")
        assert float(got) == pytest.approx(s["beta_star"], abs=2e-10)
    folds = re.findall(r"^\| fold, (\w+) \| (\d) \| K_f = ([\d.]+), .*? = ([\d.]+) \|", text, re.M)
    assert len(folds) == 2, folds
    for domain, beta, kf, r in folds:
        (fold,) = [e for e in res[domain][f"{float(beta)}"] if e["kind"] == "fold"]
        assert (kf, r) == (f"{fold['parameter']:.9f}", f"{fold['order_parameter']:.4f}"), (domain, fold)


def test_hypersphere_phase_quick_writes_under_out_only(tmp_path):
    """`python bench/hypersphere_phase.py --quick --figure`: the JSON and figure under --out, the docs' copies
    untouched; --write-docs is refused with --quick (the docs' table itself: tests/tokens/hypersphere)."""
    import json

    import hypersphere_phase

    docs = Path(hypersphere_phase.ROOT) / "docs" / "_static" / "hypersphere_phase.json"
    before = docs.read_bytes()
    with pytest.raises(SystemExit):
        hypersphere_phase.main(["--quick", "--write-docs"])
    hypersphere_phase.main(["--quick", "--figure", "--out", str(tmp_path)])
    res = json.loads((tmp_path / "hypersphere_phase.json").read_text())
    assert {r["d"] for r in res["transitions"]} == {4, 16} and (tmp_path / "hypersphere_phase.png").stat().st_size
    assert docs.read_bytes() == before


ROOT = Path(__file__).resolve().parents[1]
#: every script of bench/ that the docs name → how the suite runs it: a test of this file (or of another, as
#: "path::test") that runs it shortened, or the shortened command line that test_bench_command_runs runs
#: ("{tmp}" a temporary directory), or "--help" where a shortened run does not exist (minutes at the least: the
#: argument parser and every import only), or "import" for the scripts that read sys.argv themselves (the atlases:
#: the module imports and has its main). "library" for the peers, run by the benchmark that names them.
DOC_BENCH: dict[str, str | list[str]] = {
    "bench_box_scaling": ["--ranks", "1", "2", "--cells-1d", "200", "--cells-2d", "100", "--repeat", "1"],
    "bench_circle": ["--quick", "--repeat", "1", "--cases", "A", "--json", "{tmp}/circle.json"],
    "bench_circle_notebook": ["--help"],
    "bench_continuation": "test_bench_continuation_shrunk",
    "bench_depth_scheme": "test_bench_depth_scheme_shrunk",
    "bench_fokker_planck": ["--sizes", "8", "--steps", "2"],
    "bench_free_energy": "tests/verify/test_free_energy.py",
    "bench_free_energy_digits": ["--help"],
    "bench_langevin": "test_bench_langevin_shrunk",
    "bench_memory": "test_bench_memory_shrunk",
    "bench_particles": "test_bench_particles_shrunk",
    "bench_run": "test_bench_run_shrunk",
    "bench_sphere": ["--help"],
    "bench_sht": ["--L", "8", "--n", "200", "--repeat", "1"],
    "bench_sphere_kernel": ["--quick", "--repeat", "1", "--json", "{tmp}/kernel.json"],
    "bench_threads": "test_bench_threads_settings_give_the_same_run",
    "bench_training_step": "test_bench_training_step_shrunk",
    "bench_transport": ["--quick"],
    "bench_twin": "import",
    "circle_atlas": "import",
    "circle_peer": "library",
    "compare_reports": "import",
    "digit_box": ["--help"],
    "fe_models": "tests/test_docs.py",  # its models, imported by the free-energy page's tests
    "digit_lift": ["--help"],
    "digit_pairs": "test_digit_pairs_regenerates_the_screen_of_the_docs",
    "hypersphere_phase": "test_hypersphere_phase_quick_writes_under_out_only",
    "peer_noisy_particles": ["--quick", "--out", "{tmp}/peer.json"],
    "peer_spectral_continuation": [],  # 0.3 s: it checks K_c, K_2 against the closed forms itself
    "phase_diagrams": "test_phase_diagrams_smoke_regenerates_the_threshold_table",
    "plant_bugs": ["--help"],
    "profile_run": ["--set", "training.steps=1", "--set", "data.split=0", "--set", "data.samples=2", "--set",
                    "data.test_samples=2", "--out", "{tmp}/profile"],
    "run_all": "library",
    "sphere_atlas": "import",
    "sphere_peer": "library",
}


def test_every_bench_script_the_docs_name_runs_in_the_suite():
    """A script of bench/ that a page names has an entry in DOC_BENCH, and the test it names exists."""
    named = set()
    for page in (ROOT / "docs").glob("*.md"):
        named |= set(re.findall(r"bench/(\w+)\.py", page.read_text()))
    assert named <= set(DOC_BENCH), named - set(DOC_BENCH)
    assert set(DOC_BENCH) <= {p.stem for p in (ROOT / "bench").glob("*.py")}
    here = Path(__file__).read_text()
    for name, how in DOC_BENCH.items():
        if isinstance(how, str) and how.startswith("test_"):
            assert f"def {how}(" in here, (name, how)
        elif how == "import":
            import importlib.util

            spec = importlib.util.spec_from_file_location(f"_bench_{name}", ROOT / "bench" / f"{name}.py")
            mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
            spec.loader.exec_module(mod)  # type: ignore[union-attr]
            assert callable(mod.main), name
        elif isinstance(how, str) and how != "library":
            assert (ROOT / how).is_file() and name in (ROOT / how).read_text(), (name, how)


@pytest.mark.parametrize("name", sorted(n for n, how in DOC_BENCH.items() if isinstance(how, list)))
def test_bench_command_runs(name, tmp_path):
    """The shortened command line of DOC_BENCH, as a user runs it (from the repository root): exit status 0."""
    import os
    import subprocess

    args = [a.replace("{tmp}", str(tmp_path)) for a in DOC_BENCH[name]]  # type: ignore[union-attr]
    r = subprocess.run([sys.executable, str(ROOT / "bench" / f"{name}.py"), *args], cwd=ROOT, capture_output=True,
                       text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600)
    assert r.returncode == 0, (name, r.stdout[-2000:], r.stderr[-4000:])


def test_every_plant_site_is_in_the_code():
    """bench/plant_bugs.py's plants (bench/plants/ included): each one's text occurs exactly once in its file, so a
    change of the code under a plant shows here, not as "plant site not found" in a later audit."""
    import runpy

    plants = runpy.run_path(str(ROOT / "bench" / "plant_bugs.py"), run_name="plants")["PLANTS"]
    stale = [name for name, (file, old, *_) in plants.items() if (ROOT / file).read_text().count(old) != 1]
    assert not stale, stale
