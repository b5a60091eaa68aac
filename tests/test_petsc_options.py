"""PETSc options (issue 10): mfpde's defaults only where the user set none, a tidy options database,
options from ``PETSC_OPTIONS`` taking effect, rejected options as input errors, convergence checked."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from mpi4py import MPI
from petsc4py import PETSc

import dolfinx.fem
import dolfinx.fem.petsc
import numpy as np
import pytest
import ufl
from configs import DEEP

from mfpde.errors import ConfigError, SolverError
from mfpde.mesh import box
from mfpde.petsc import LinearSolver

pytestmark = pytest.mark.ranks  # the rank count can change what it checks: run again under mpiexec

ROOT = Path(__file__).resolve().parent.parent
SMALL = ["tokens.cells=[8, 8]", "heads.cells=[8, 8]", "depth.steps=4", "data.samples=2", "data.test_samples=0",
         "training.steps=1", "output.plots=false", "output.fields=false"]


_KEEP: list = []  # the meshes: their communicator must outlive the matrices


def _mass_matrix() -> PETSc.Mat:
    msh = box(MPI.COMM_WORLD, [[0.0, 1.0], [0.0, 1.0]], [6, 6], "triangle").mesh
    V = dolfinx.fem.functionspace(msh, ("Lagrange", 1))
    u, v = ufl.TrialFunction(V), ufl.TestFunction(V)
    A = dolfinx.fem.petsc.assemble_matrix(dolfinx.fem.form(u * v * ufl.dx))
    A.assemble()
    _KEEP.append(msh)
    return A


def _keys(prefix: str) -> set[str]:
    return {k for k in PETSc.Options().getAll() if k.startswith(prefix)}


def test_defaults_user_options_and_tidy_database():
    A = _mass_matrix()
    defaults = {"ksp_type": "preonly", "pc_type": "lu", "pc_factor_mat_solver_type": "mumps"}
    s = LinearSolver(A, "test_ls_a_", None, defaults)
    assert (s.ksp_type, s.pc_type) == ("preonly", "lu") and "mumps" in s.describe()
    assert not _keys("test_ls_a_"), "the defaults were left in the options database"
    # the user's options win; the MUMPS default is dropped with a non-factorising preconditioner
    s = LinearSolver(A, "test_ls_b_", {"ksp_type": "cg", "pc_type": "jacobi", "ksp_rtol": 1e-12}, defaults)
    assert (s.ksp_type, s.pc_type) == ("cg", "jacobi")
    b, x = A.createVecRight(), A.createVecRight()
    b.set(1.0)
    assert s.solve(b, x) > 1
    assert not _keys("test_ls_b_")
    # options already in the database (PETSC_OPTIONS, command line) beat the defaults and are kept
    db = PETSc.Options()
    db["test_ls_c_ksp_type"] = "gmres"
    db["test_ls_c_pc_type"] = "jacobi"
    try:
        s = LinearSolver(A, "test_ls_c_", None, defaults)
        assert (s.ksp_type, s.pc_type) == ("gmres", "jacobi")
        assert _keys("test_ls_c_") == {"test_ls_c_ksp_type", "test_ls_c_pc_type"}
        assert db.getString("test_ls_c_ksp_type") == "gmres"
    finally:
        db.delValue("test_ls_c_ksp_type")
        db.delValue("test_ls_c_pc_type")


def test_rejected_options_and_non_convergence():
    A = _mass_matrix()
    with pytest.raises(ConfigError, match="petsc.param: PETSc rejected"):
        LinearSolver(A, "test_ls_d_", {"ksp_type": "no-such-ksp"}, what="petsc.param")
    assert not _keys("test_ls_d_")
    s = LinearSolver(A, "test_ls_e_", {"ksp_type": "gmres", "pc_type": "none", "ksp_max_it": 1, "ksp_rtol": 1e-14})
    b, x = A.createVecRight(), A.createVecRight()
    b.setArray(np.linspace(1.0, 2.0, b.getLocalSize()))
    with pytest.raises(SolverError, match="did not converge"):
        s.solve(b, x)


def test_unused_and_rejected_options_one_line():
    """A misspelt key (PETSc never reads it) and an unknown type are input errors in one line, no PETSc stack."""
    A = _mass_matrix()
    with pytest.raises(ConfigError, match="petsc.param: PETSc did not use the option.s. ksp_tpye") as e:
        LinearSolver(A, "test_ls_f_", {"ksp_tpye": "cg", "pc_type": "jacobi"}, what="petsc.param")
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="Unable to find requested PC type bork") as e:
        LinearSolver(A, "test_ls_g_", {"pc_type": "bork"}, what="petsc.param")
    assert "\n" not in str(e.value) and "[0]" not in str(e.value)
    assert not _keys("test_ls_f_") and not _keys("test_ls_g_")


def test_two_runs_in_one_process_do_not_share_options(tempdir, capfd):
    """The first transport's ksp_max_it = 1 (GMRES without preconditioner: exit 3) must not reach the second."""
    from mfpde.cli import main

    demo = str(ROOT / "demos" / "transport_small.toml")
    bad = "petsc.token={ksp_type = 'gmres', pc_type = 'none', ksp_max_it = 1, ksp_rtol = 1e-14}"
    assert main(["transport", demo, "--out", str(tempdir / "a"), "--set", bad]) == 3
    assert main(["transport", demo, "--out", str(tempdir / "b")]) == 0, capfd.readouterr().err
    assert not _keys("mfpde_token_")


@pytest.mark.serial
def test_petsc_options_environment_takes_effect(tempdir):
    """PETSC_OPTIONS="-mfpde_param_ksp_type gmres -mfpde_param_pc_type jacobi ..." switches the Fokker–Planck
    solve of ``mfpde run`` (seen at PETSc initialisation, so in a fresh process); the run logs the KSP used."""
    # A tight tolerance, or the iterative solve misses the mass check of every step (|∫ρ − 1| ≤ 1e-8, exit 3).
    env = dict(os.environ, PETSC_OPTIONS="-mfpde_param_ksp_type gmres -mfpde_param_pc_type jacobi "
               "-mfpde_param_ksp_rtol 1e-13")
    args = [a for s in SMALL for a in ("--set", s)]
    r = subprocess.run([sys.executable, "-m", "mfpde", "run", DEEP, "--out", str(tempdir), *args], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    line = next((x for x in r.stderr.splitlines() if "linear solvers" in x), "")
    assert "mfpde_param_: KSP gmres, PC jacobi" in line, r.stderr
    assert "mfpde_token_: KSP preonly, PC bjacobi" in line, r.stderr  # the token defaults are untouched
    # without the variable: mfpde's defaults
    env.pop("PETSC_OPTIONS")
    r = subprocess.run([sys.executable, "-m", "mfpde", "run", DEEP, "--out", str(tempdir), "--overwrite", *args],
                       cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "mfpde_param_: KSP preonly, PC lu (mumps)" in r.stderr, r.stderr


def test_unused_option_from_the_database_is_an_input_error():
    """A misspelt key from PETSC_OPTIONS or the command line (already in the options database) is exit 2 naming
    it, and only it is taken out of the database (PETSc would repeat it at exit)."""
    A = _mass_matrix()
    db = PETSc.Options()
    db["test_ls_h_ksp_tpye"] = "cg"
    db["test_ls_h_pc_type"] = "jacobi"
    try:
        with pytest.raises(ConfigError, match="did not use the option.s. -test_ls_h_ksp_tpye of PETSC_OPTIONS"):
            LinearSolver(A, "test_ls_h_", None, {"ksp_type": "cg"}, what="petsc.param")
        assert _keys("test_ls_h_") == {"test_ls_h_pc_type"}
    finally:
        for k in ("test_ls_h_ksp_tpye", "test_ls_h_pc_type"):
            if db.hasName(k):
                db.delValue(k)


@pytest.mark.serial
def test_misspelt_petsc_options_environment_exit_2(tempdir):
    """PETSC_OPTIONS="-mfpde_param_ksp_tpye cg" ended with exit 0 and PETSc's four-line "Option left" warning;
    now exit 2 and one line naming the option."""
    env = dict(os.environ, PETSC_OPTIONS="-mfpde_param_ksp_tpye cg")
    args = [a for s in SMALL for a in ("--set", s)]
    r = subprocess.run([sys.executable, "-m", "mfpde", "run", DEEP, "--quiet", "--out", str(tempdir), *args], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=600)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and "-mfpde_param_ksp_tpye" in lines[0], r.stderr


def test_rejected_option_from_the_database_names_petsc_options():
    """PETSC_OPTIONS="-mfpde_token_ksp_type bork" was blamed on ``petsc.token {}`` (the config's empty table): the
    message names PETSC_OPTIONS and the option, and the config's table only when it has options too."""
    A = _mass_matrix()
    db = PETSc.Options()
    db["test_ls_i_ksp_type"] = "bork"
    try:
        with pytest.raises(ConfigError, match=r"^PETSC_OPTIONS .*-test_ls_i_ksp_type bork: .*bork") as info:
            LinearSolver(A, "test_ls_i_", None, {"ksp_type": "cg"}, what="petsc.token")
        assert "petsc.token" not in str(info.value)
        with pytest.raises(ConfigError, match=r"^petsc.token and PETSC_OPTIONS .*'pc_type': 'jacobi'"):
            LinearSolver(A, "test_ls_i_", {"pc_type": "jacobi"}, {"ksp_type": "cg"}, what="petsc.token")
    finally:
        db.delValue("test_ls_i_ksp_type")


@pytest.mark.serial
def test_petsc_options_file_petsc_cannot_read_exit_2(tempdir):
    """PETSC_OPTIONS="-options_file F" with F not an options file: PETSc's error stack and a petsc4py traceback
    (exit 1) while PETSc started; now exit 2 and one line naming PETSC_OPTIONS and PETSc's reason."""
    bad = tempdir / "passwd"
    bad.write_text("root:x:0:0:root:/root:/bin/bash\n")
    for value, says in ((f"-options_file {bad}", "Unknown first token"),
                        (f"-options_file {tempdir / 'nosuch'}", "Unable to open options file")):
        env = dict(os.environ, PETSC_OPTIONS=value)
        r = subprocess.run([sys.executable, "-m", "mfpde", "transport", str(ROOT / "demos" / "transport_small.toml"),
                            "--out", str(tempdir / "out")], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=300)
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.returncode == 2 and len(lines) == 1, r.stderr
        assert lines[0].startswith("mfpde: error: PETSC_OPTIONS: ") and says in lines[0], r.stderr
        assert not (tempdir / "out").exists()
