"""PETSc objects are freed with the solvers that own them.

petsc4py does not destroy a parallel PETSc object that Python's garbage collector frees: it defers it to PETSc's
garbage of the object's communicator, which nothing cleans for a mesh's communicator. Each solver left there
keeps PETSc's and MUMPS's duplicated communicators, and MPICH has 2048 context ids a process: the MPI test suite
was killed ("Cannot allocate context ID", exit 15, no output) when `mfpde verify --quick` ran after the other
files. The solvers release their PETSc objects in ``__del__`` and :func:`mfpde.petsc.collect_garbage` destroys them
where all ranks meet; these tests build solvers several times and count the context ids left.
"""

from __future__ import annotations

from mpi4py import MPI

import dolfinx.fem
import numpy as np
import pytest
from configs import DEEP

from mfpde.config import load
from mfpde.heads import HeadMeasure
from mfpde.mesh import box
from mfpde.petsc import collect_garbage
from mfpde.tokens.box.data import Sample, fill_density
from mfpde.tokens.box.transport import TokenTransport
from mfpde.training.problem import CoupledProblem

pytestmark = pytest.mark.ranks  # the rank count can change what it checks: run again under mpiexec

#: More communicators than MPICH can make (2048 context ids): the count below is exact under MPICH, and under an
#: MPI with more ids it stops here (then the test cannot see a leak, but does not fail).
CAP = 4096


def _free_context_ids(comm: MPI.Comm) -> int:
    """How many duplicates of comm can be made now (collective): MPI_Comm_dup until it fails, then free them."""
    comm.Set_errhandler(MPI.ERRORS_RETURN)
    dups = []
    try:
        while len(dups) < CAP:
            dups.append(comm.Dup())
    except MPI.Exception:
        pass
    finally:
        for c in dups:
            c.Free()
        comm.Set_errhandler(MPI.ERRORS_ARE_FATAL)
    return len(dups)


def _transport() -> None:
    """A DG1 token transport (its mass matrix and KSP) solving a few depth steps."""
    tt = TokenTransport(box(MPI.COMM_WORLD, [[-4.0, 4.0]], [40], "quadrilateral"), 1)
    u = dolfinx.fem.Function(tt.W)
    fill_density(Sample("gaussian", {"mean": np.array([0.2]), "cov": np.array([[0.25]])}, 0.0), u, tt.mass)
    tt.solve(u, HeadMeasure(np.array([-1.0, -0.5]), np.array([0.5, 0.5])), 1.0, 3)


def _coupled() -> None:
    """A coupled problem (token transport, adjoint, entropic Fokker–Planck with MUMPS): a gradient and one
    Lie step."""
    cfg = load(DEEP, ["tokens.cells=[8, 8]", "heads.cells=[6, 6]", "depth.steps=2", "data.samples=2",
                      "data.test_samples=0", "training.lambda=0.05"])
    pb = CoupledProblem.from_config(cfg, MPI.COMM_WORLD)
    assert np.isfinite(pb.gradient(pb.heads()).risk)
    pb.splitting().step(0.01)


@pytest.mark.parametrize("build", [_transport, _coupled], ids=["transport", "coupled"])
def test_solvers_free_their_communicators(build):
    """Three builds (and uses) of a solver leave as many free context ids as one: the ids a solver takes are
    given back when it is freed (the first build may keep ids for good: JIT modules, cached splits)."""
    comm = MPI.COMM_WORLD
    build()
    collect_garbage()
    before = _free_context_ids(comm)
    for _ in range(3):
        build()
        collect_garbage()
    after = _free_context_ids(comm)
    assert after == before, f"{before - after} context ids not given back after 3 builds"


# Memory estimates (mfpde.limits.memory_estimate): a lower bound of what a run holds, token and head parts summed.

#: The stated bound of the estimate: a run holds at most this many times the estimate (module docstring of
#: mfpde.limits: 1.3 to 3.6 on the calibration runs).
MEMORY_FACTOR = 4.0


def _node_bytes() -> float:
    from mfpde.limits import node_memory_bytes

    return node_memory_bytes()


@pytest.mark.serial  # launches its own process, one rank
def test_memory_estimate_is_below_the_peak_rss_of_a_run_within_its_factor(tmp_path):
    """The peak RSS of a modest run (set-up, two evaluations, one step) is between the estimate and
    MEMORY_FACTOR times it."""
    import os
    import subprocess
    import sys

    from test_mpi_failures import ROOT

    from mfpde.limits import memory_estimate

    sets = ['heads.family="scalar"', "tokens.cells=[100, 100]", "heads.cells=[32, 32]", "training.steps=1",
            "output.fields=false", "output.plots=false"]
    est = sum(memory_estimate(load(None, sets), 1, "run").values())
    cmd = [sys.executable, "-c", "import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True); "
           "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)",
           sys.executable, "-m", "mfpde", "run", "--quiet", "--out", str(tmp_path / "o"),
           *[a for s in sets for a in ("--set", s)]]
    out = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr
    rss = float(out.stdout.split()[-1]) * 1024  # kB on Linux
    assert est <= rss <= MEMORY_FACTOR * est, f"estimate {est / 1e6:.0f} MB, peak RSS {rss / 1e6:.0f} MB"


def test_token_cells_that_cannot_fit_are_refused():
    """A d = 2 DG0 run of 0.6 × the node's memory / 1 kB token cells (what the 1 kB a cell of the earlier estimate
    let through) needs more than the node at the measured bytes per cell: refused naming tokens.cells."""
    from mfpde.errors import ConfigError
    from mfpde.limits import check_resources

    n = int((0.6 * _node_bytes() / 1000.0) ** 0.5)
    cfg = load(None, [f"tokens.cells=[{n}, {n}]"])
    with pytest.raises(ConfigError, match=r"^tokens\.cells: .* GB per rank"):
        check_resources(cfg, 1, "run")


def test_token_and_head_memory_are_summed():
    """Token cells and Θ cells that each take 0.6 of the node's memory alone are refused together."""
    from mfpde.errors import ConfigError
    from mfpde.limits import check_resources, memory_estimate

    mem, scalar = _node_bytes(), 'heads.family="scalar"'  # Θ ⊂ R² (the default's value heads have Θ ⊂ R)
    per_token = memory_estimate(load(None, [scalar, "tokens.cells=[1000, 1000]"]), 1, "run")["tokens.cells"] / 1e6
    per_theta = memory_estimate(load(None, [scalar, "heads.cells=[1000, 1000]"]), 1, "run")["heads.cells"] / 1e6
    nt, nh = int((0.6 * mem / per_token) ** 0.5), int((0.6 * mem / per_theta) ** 0.5)
    for sets in ([f"tokens.cells=[{nt}, {nt}]"], [f"heads.cells=[{nh}, {nh}]"]):
        check_resources(load(None, [scalar, *sets]), 1, "run")  # each alone fits
    with pytest.raises(ConfigError, match="GB per rank"):
        check_resources(load(None, [scalar, f"tokens.cells=[{nt}, {nt}]", f"heads.cells=[{nh}, {nh}]"]), 1, "run")


@pytest.mark.parametrize(("mean", "cov", "box"), [
    ([0.3], [[0.04]], [[-1.0, 1.0]]), ([3.0], [[0.01]], [[3.2, 4.0]]), ([-3.0], [[0.01]], [[-4.0, -3.2]]),
    ([3.0], [[0.01]], [[3.1, 3.2]]), ([-3.0], [[0.01]], [[-3.2, -3.1]]), ([0.0], [[1.0]], [[-0.5, 7.0]]),
    ([0.5, -0.2], [[0.1, 0.0], [0.0, 0.3]], [[-2.0, 2.0], [-1.0, 0.5]]),
    ([0.5, 0.5], [[0.1, 0.05], [0.05, 0.1]], [[-2.0, 2.0], [-2.0, 2.0]])])
def test_gaussian_box_mass_against_scipy_stats(mean, cov, box):
    """The Gaussian's mass in a box (the door check of ρ₀ and of Gaussian data) against scipy.stats' CDFs, in both
    tails too (intervals 2σ to 10σ from the mean: relative accuracy, not only absolute)."""
    import numpy as np
    import scipy.stats

    from mfpde.limits import gaussian_box_mass

    m, c = np.array(mean), np.array(cov)
    if np.count_nonzero(c - np.diag(np.diag(c))) == 0:
        ref = np.prod([scipy.stats.norm(m[j], np.sqrt(c[j, j])).cdf(box[j][1])
                       - scipy.stats.norm(m[j], np.sqrt(c[j, j])).cdf(box[j][0]) if box[j][0] < m[j] else
                       scipy.stats.norm(m[j], np.sqrt(c[j, j])).sf(box[j][0])
                       - scipy.stats.norm(m[j], np.sqrt(c[j, j])).sf(box[j][1]) for j in range(len(m))])
        assert gaussian_box_mass(mean, cov, box) == pytest.approx(ref, rel=1e-12)
    else:
        ref = scipy.stats.multivariate_normal(m, c).cdf([b[1] for b in box], lower_limit=[b[0] for b in box])
        assert gaussian_box_mass(mean, cov, box) == pytest.approx(ref, rel=1e-6)


@pytest.mark.parametrize("out", ["/usr/lib", "/usr/local/share/x", "/lib64", "/sbin/y", "/proc/self", "/sys/kernel",
                                 "/dev/shm/run", "/boot/grub", "/etc/mfpde", "/var/lib", "/var/lib/dpkg/run1",
                                 "/var/log/x", "/bin"])
def test_out_in_a_system_tree_is_refused(out):
    """``--out /usr/lib`` exited 0 and wrote its report, history and checkpoint there: a directory of the trees the
    filesystem hierarchy reserves for the system (and any below them) is refused, before anything is written."""
    from pathlib import Path

    from mfpde.cli import _check_out
    from mfpde.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^--out .* (system|reserves)"):
        _check_out(Path(out))


@pytest.mark.parametrize("out", ["/tmp/mfpde-run1", "out/run1", "/var/tmp/x/y", "/srv/data/run1", "/opt/x/run1"])
def test_out_outside_the_system_trees_is_accepted(out):
    """Directories of their own below /tmp, /var/tmp, /srv, /opt or the working directory are DIRs."""
    from pathlib import Path

    from mfpde.cli import _check_out

    assert _check_out(Path(out)) == Path(out)


def test_out_below_a_home_in_a_system_tree_is_accepted():
    """A system account's home may lie in /var/lib: a directory below it is the user's own."""
    from pathlib import Path

    from mfpde.outdir import reserved

    home = Path("/var/lib/postgresql")
    assert reserved(home / "run1", home) == "" and reserved(home, home) == "the home directory"
    assert reserved(Path("/var/lib/other"), home) != ""


@pytest.mark.serial  # launches its own process
def test_a_transport_mesh_that_cannot_fit_is_refused_at_once(tmp_path):
    """A d = 2 DG0 transport of 0.6 × the node's memory / 1 kB token cells (what the 1 kB a cell and block of the
    earlier estimate let through: [5000, 5000] needs more than 60 GB) is refused by ``mfpde transport`` within 5 s,
    naming tokens.cells, the estimate and the node's memory, and nothing is written."""
    import os
    import subprocess
    import sys
    import time

    from test_mpi_failures import ROOT

    n = int((0.6 * _node_bytes() / 1000.0) ** 0.5)
    out = tmp_path / "o"
    cmd = [sys.executable, "-m", "mfpde", "transport", str(ROOT / "demos" / "gaussian_2d.toml"), "--quiet", "--out",
           str(out), "--set", f"tokens.cells=[{n}, {n}]"]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                          timeout=120)
    took = time.monotonic() - t0
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("mfpde: error: tokens.cells: ") and "GB per rank" in lines[0], lines[0]
    assert "GB of this node" in lines[0] and not out.exists()
    assert took < 5.0, f"refused after {took:.1f} s"


@pytest.mark.serial  # launches its own process, one rank
def test_transport_memory_estimate_is_below_the_peak_rss_within_its_factor(tmp_path):
    """The peak RSS of a d = 2 DG0 transport with fields and plots (set-up, one depth step, the writer, the plot) is
    between the estimate and MEMORY_FACTOR times it."""
    import os
    import subprocess
    import sys

    from test_mpi_failures import ROOT

    from mfpde.limits import memory_estimate

    sets = ["tokens.cells=[300, 300]", "depth.steps=1", "depth.T=0.0001"]
    est = sum(memory_estimate(load(ROOT / "demos" / "gaussian_2d.toml", sets), 1, "transport").values())
    cmd = [sys.executable, "-c", "import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True); "
           "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)",
           sys.executable, "-m", "mfpde", "transport", str(ROOT / "demos" / "gaussian_2d.toml"), "--quiet", "--out",
           str(tmp_path / "o"), *[a for s in sets for a in ("--set", s)]]
    out = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr
    rss = float(out.stdout.split()[-1]) * 1024  # kB on Linux
    assert est <= rss <= MEMORY_FACTOR * est, f"estimate {est / 1e6:.0f} MB, peak RSS {rss / 1e6:.0f} MB"


@pytest.mark.serial  # launches its own process
def test_circle_dg_work_that_cannot_end_is_refused_before_any_array(tmp_path):
    """Circle DG on 1048576 cells at degree 6 needs at least 10¹⁸ sub-steps (the growth cap): refused within 5 s
    naming tokens.cells and the bound, nothing written (was: logged, then 53 s of set-up before the first depth
    step was refused)."""
    import os
    import subprocess
    import sys
    import time

    from test_mpi_failures import ROOT

    out = tmp_path / "o"
    cmd = [sys.executable, "-m", "mfpde", "transport", str(ROOT / "demos" / "circle.toml"), "--quiet", "--out",
           str(out), "--set", "tokens.cells=[1048576]", "--set", "tokens.degree=6"]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                          timeout=120)
    took = time.monotonic() - t0
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("mfpde: error: tokens.cells: the job would take more than"), lines[0]
    assert "sub-steps" in lines[0] and "year of wall time" in lines[0] and not out.exists()
    assert took < 5.0, f"refused after {took:.1f} s"


def test_the_work_ceiling_is_one_mechanism():
    """check_work refuses beyond MAX_SECONDS (and an unbounded bound), naming the key and how the bound is made."""
    from mfpde.errors import ConfigError
    from mfpde.limits import MAX_SECONDS, check_work

    check_work(MAX_SECONDS, "tokens.cells", "x")
    with pytest.raises(ConfigError, match=r"^tokens\.cells: the job would take more than 2 years .*\(how;"):
        check_work(2 * 3.15e7, "tokens.cells", "how")
    with pytest.raises(ConfigError, match="would take an unbounded time"):
        check_work(float("inf"), "tokens.beta", "how")


@pytest.mark.serial  # launches its own process
def test_a_sphere_dg_mesh_that_cannot_fit_is_refused_at_once(tmp_path):
    """The sphere's DG3 at the least refinement whose estimate (5 kB a DG value, half the measured 9.3 kB) exceeds the
    node's memory (refine 8 on a node below 66 GB) is refused within 5 s naming tokens.refine, nothing written (was:
    minutes of set-up towards about 120 GB)."""
    import math
    import os
    import subprocess
    import sys
    import time

    from test_mpi_failures import ROOT

    from mfpde.tokens.sphere.job import BYTES_PER_DG_VALUE

    refine = math.ceil(math.log(_node_bytes() / (20 * 10 * BYTES_PER_DG_VALUE), 4))
    out = tmp_path / "o"
    cmd = [sys.executable, "-m", "mfpde", "transport", str(ROOT / "demos" / "sphere.toml"), "--quiet", "--out",
           str(out), "--set", f"tokens.refine={refine}", "--set", "tokens.degree=3"]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                          timeout=120)
    took = time.monotonic() - t0
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"mfpde: error: tokens.refine: {refine} (DG3") and "GB of this node" in lines[0]
    assert not out.exists() and took < 5.0, f"refused after {took:.1f} s"
