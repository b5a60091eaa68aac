"""What the commands write: the resolved config with the keys in use, accuracy for ±1 file targets, warnings only
where they apply, the transport plot. Serially and under MPI."""

from __future__ import annotations

import logging
import re
import tomllib
from pathlib import Path

from mpi4py import MPI

import numpy as np
import pytest

import mfpde
from mfpde import cli
from mfpde.config import from_dict
from mfpde.config.keys import in_use, schema_keys, to_toml

pytestmark = pytest.mark.ranks  # the rank count can change what it checks: run again under mpiexec

ROOT = Path(__file__).resolve().parent.parent
SMALL = str(ROOT / "demos" / "transport_small.toml")
PNG = b"\x89PNG\r\n\x1a\n"


def _keys(text: str) -> set[str]:
    out, sec = set(), ""
    for line in text.splitlines():
        if line.startswith("["):
            sec = line.strip("[]")
        elif " = " in line:
            out.add(f"{sec}.{line.split(' = ')[0]}")
    return out


def test_resolved_config_has_only_the_keys_in_use_and_loads_back():
    digits = mfpde.load_config()  # the embedded default: digits, all images by split
    text = to_toml(digits)
    keys = _keys(text)
    for unused in ("data.mean", "data.cov", "data.target", "data.samples", "data.test_samples", "data.path",
                   "depth.steps", "depth.layers", "heads.mesh", "tokens.mesh", "petsc.token"):
        assert unused not in keys, unused
    assert {"data.classes", "data.split", "loss.w", "training.lambda", "tokens.cells"} <= keys, keys
    back = from_dict(tomllib.loads(text))
    assert to_toml(back) == text
    for key in schema_keys():  # every key in use has the same value
        if in_use(digits, key):
            sec, k = key.split(".")
            k = "lam" if key == "training.lambda" else k
            assert getattr(getattr(back, sec), k) == getattr(getattr(digits, sec), k), key
    gauss = _keys(to_toml(mfpde.load_config(SMALL)))
    assert {"data.mean", "data.cov", "data.target"} <= gauss and not gauss & {"data.classes", "data.samples"}
    assert len(_keys(to_toml(digits, only_in_use=False))) == len(schema_keys())
    circle = mfpde.load_config(str(ROOT / "demos" / "circle.toml"))
    text = to_toml(circle)
    keys = _keys(text)
    assert {"tokens.domain", "tokens.attention", "tokens.cells"} <= keys, keys
    assert not keys & {"tokens.box", "tokens.cell", "data.mean", "data.classes"}, keys
    assert to_toml(from_dict(tomllib.loads(text))) == text
    # noisy tokens on the sphere: the written config keeps τ (transport) and [continuation] (continuation)
    noisy = mfpde.load_config(str(ROOT / "demos" / "noisy_sphere.toml"))
    text = to_toml(noisy)
    assert {"tokens.noise", "tokens.degree", "continuation.start", "continuation.points"} <= _keys(text), text
    assert from_dict(tomllib.loads(text)).tokens.noise == noisy.tokens.noise == 1.0


def _file_data(tempdir: Path) -> Path:
    path = tempdir / "pm1.npz"
    if MPI.COMM_WORLD.rank == 0:
        rng = np.random.default_rng(3)
        centres = np.array([-0.6, 0.5, -0.4, 0.7])
        pts = centres[:, None, None] + 0.2 * rng.standard_normal((4, 30, 1))
        np.savez(path, points=pts, weights=np.ones((4, 30)), target=np.sign(centres))
    MPI.COMM_WORLD.Barrier()
    return path


def test_file_targets_of_plus_minus_one_get_accuracy_and_no_inapplicable_warning(tempdir, caplog):
    cfg = mfpde.make_config(tokens={"cells": [40]}, depth={"steps": 5}, heads={"family": "value", "cells": [20]},
                            data={"kind": "file", "path": str(_file_data(tempdir))},
                            training={"steps": 2, "ds": 0.1}, output={"every": 1, "plots": False, "fields": False})
    with caplog.at_level(logging.INFO, logger="mfpde"):
        run = mfpde.train(cfg, tempdir / "run")
    assert run.status == "ok"
    assert "train_accuracy" in run.history and 0 <= run.history["train_accuracy"][-1] <= 1
    acc = run.report["accuracy"]
    assert acc["train"] == run.history["train_accuracy"][-1] and acc["initial"]["train"] == run.history[
        "train_accuracy"][0]
    # the NTK of value heads on 4 samples is degenerate, but λ > 0: theory §5.5 is not what this run relies on
    assert run.report["final"]["ntk"]["degenerate"]
    assert not [r for r in caplog.records if "NTK degenerate" in r.getMessage() and r.levelno >= logging.INFO]


def test_transport_writes_a_plot_of_mu_0_and_mu_t(tempdir):
    out = tempdir / "t"
    assert cli.main(["transport", SMALL, "--out", str(out), "--set", "output.fields=false"]) == 0
    png = out / "plots" / "tokens.png"
    assert png.read_bytes()[:8] == PNG and png.stat().st_size > 5000


def test_verify_table_is_one_kind_per_column_and_at_most_120_wide():
    """The table of today's verify_last.json: measured, reference, error, threshold columns, ≤ 120 wide, and a
    check's row shows its registered kind, its numbers in their columns and its whole threshold."""
    import json

    from mfpde.jobs.verify import _load_checks
    from mfpde.verify.registry import CHECKS
    from mfpde.verify.table import COLUMNS, format_table

    _load_checks()
    records = json.loads((ROOT / "docs" / "_static" / "verify_last.json").read_text())["checks"]
    # the stored run is of today's registry (as sets: CHECKS is in the order this process imported the modules)
    assert sorted(r["name"] for r in records) == sorted(CHECKS)
    table = format_table(records)
    lines = table.splitlines()
    assert max(len(line) for line in lines) <= 120, max(lines, key=len)
    assert lines[0].split() == list(COLUMNS), lines[0]
    starts = [m.start() for m in re.finditer(r"-+", lines[1])]  # the column starts, from the dashes
    col = {c: starts[i] for i, c in enumerate(COLUMNS)}
    for r in records:
        (i,) = [i for i, line in enumerate(lines) if line.startswith(r["name"] + " ")]
        row, more = lines[i], []
        for line in lines[i + 1:]:  # the threshold's continuation lines: blank but in its column
            if line[:col["threshold"]].strip():
                break
            more.append(line)
        kind = CHECKS[r["name"]].kind
        assert r["kind"] == kind and row[col["kind"]:].startswith(kind), row
        assert row[col["measured"]:].startswith(f"{r['measured']:.4g}"), row
        if r["reference_value"] is None:  # a bound: no reference, no error
            assert r["error"] is None and not row[col["reference"]:col["threshold"]].strip(), row
        else:
            assert row[col["reference"]:].startswith(f"{r['reference_value']:.4g}"), row
            assert r["error"] == pytest.approx(abs(r["measured"] - r["reference_value"]), rel=1e-12, abs=1e-300)
            assert row[col["error"]:].startswith(f"{r['error']:.2g}"), row
        cell = " ".join(line[col["threshold"]:col["verdict"]].strip() for line in [row, *more])
        assert cell == " ".join(r["threshold"].split()), (cell, r["threshold"])  # all of it, in its column
        assert row[col["verdict"]:].startswith("pass" if r["passed"] else "FAIL"), row


def test_verify_table_reads_reports_without_reference_columns():
    """A report written before the reference and error columns (``value`` only) still prints, those cells empty."""
    from mfpde.verify.table import format_table

    old = [{"name": "adjoint_taylor", "kind": "slope", "value": 1.98, "threshold": "|slope − 2| < 0.1", "passed": True,
            "wall_s": 3.0}]
    row = format_table(old).splitlines()[2]
    assert row.split() == ["adjoint_taylor", "slope", "1.98", "|slope", "−", "2|", "<", "0.1", "pass", "3.0"], row


def _value_run(tempdir, name, depth=None, **heads):
    """Value heads (p = 1: Θ an interval of 20 cells) on 4 samples of ±1 targets, 2 steps: a run of seconds."""
    cfg = mfpde.make_config(tokens={"cells": [40]}, depth=depth or {"steps": 5},
                            heads={"family": "value", "cells": [20], **heads},
                            data={"kind": "file", "path": str(_file_data(tempdir))},
                            training={"steps": 2, "ds": 0.1}, output={"every": 1, "plots": False, "fields": False})
    return mfpde.train(cfg, tempdir / name)


def test_theta_boundary_mass_reported_and_warned_naming_heads_box(tempdir, caplog):
    """ρ pressed into a corner of Θ by the box went unreported: ``final.theta_boundary_mass`` is ρ's mass in the Θ
    cells touching ∂Θ (here the first and last of the interval's 20 cells, ∫ of the P1 ρ by the trapezoid rule), and
    above 1e-2 a warning names heads.box, in the log and in ``warnings`` (always present, empty when all is well)."""
    calm = _value_run(tempdir, "calm", box=[[-2.0, 2.0]], init={"kind": "gaussian", "mean": [0.0], "cov": [[0.04]]})
    with caplog.at_level(logging.WARNING, logger="mfpde"):
        edge = _value_run(tempdir, "edge", box=[[-0.5, 0.5]],
                          init={"kind": "gaussian", "mean": [0.35], "cov": [[0.01]]})
    for run in (calm, edge):
        assert run.status == "ok"
        v, rho = run.theta_points[:, 0], run.rho[0]
        order = np.argsort(v)
        v, rho = v[order], rho[order]
        h = np.diff(v)
        expected = 0.5 * (h[0] * (rho[0] + rho[1]) + h[-1] * (rho[-2] + rho[-1]))
        assert run.report["final"]["theta_boundary_mass"] == pytest.approx(expected, rel=1e-10, abs=1e-300)
    assert calm.report["final"]["theta_boundary_mass"] < 1e-2 and calm.report["warnings"] == []
    assert edge.report["final"]["theta_boundary_mass"] > 1e-2
    (w,) = [w for w in edge.report["warnings"] if "heads.box" in w]
    assert any(w in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert "token_outflow" in edge.report["final"] and edge.report["final"]["token_outflow"] >= 0.0


def test_certificate_is_a_bound_only_where_r_is_convex_in_rho(tempdir):
    """The report claimed "F* known to within λ KL" for every single-layer entropic run; on digits (scalar heads)
    λ KL fell up to 1.8× below F − F*. Now value heads on the single-layer model (R convex in c = ∫v dρ, checked at
    the kink c = 0) keep the bound; scalar heads say that it is not one."""
    from types import SimpleNamespace

    from mfpde.heads import HeadMeasure
    from mfpde.training.problem import CoupledProblem
    from mfpde.training.report import certificate_bound

    gauss = mfpde.load_config(str(ROOT / "demos" / "value_heads.toml"), ['depth.model="shallow"', "training.steps=2",
                                                                         "output.plots=false", "output.fields=false"])
    pm1 = mfpde.make_config(tokens={"cells": [40]}, depth={"model": "shallow"},
                            heads={"family": "value", "cells": [20]},
                            data={"kind": "file", "path": str(_file_data(tempdir))})
    for cfg in (gauss, pm1):
        cp = CoupledProblem.from_config(cfg)
        y = np.array([s.target for s in cp.problem.train])
        R = {c: 0.5 * np.mean((cp.objective.predict(cp.problem.train, [HeadMeasure(np.array([0.5]), np.array([c]))])
                               - y) ** 2) for c in (-0.2, -0.1, 0.0, 0.1, 0.2)}
        # R is quadratic on each side of c = 0: its one-sided slopes at 0 exactly from three values each
        right = (4 * R[0.1] - R[0.2] - 3 * R[0.0]) / 0.2
        left = -(4 * R[-0.1] - R[-0.2] - 3 * R[0.0]) / 0.2
        c0 = sum(h.abar for h in cp.heads())  # ρ₀'s ∫v dρ
        # convex across the kink, or the minimiser's side (R falls through c = 0 towards it) is ρ₀'s
        expected = bool(right >= left or (right * left > 0 and c0 * right < 0))
        bound, why = certificate_bound(cp)
        assert bound is expected, (why, left, right, c0)
        if cfg is pm1:  # these data have a drop at the kink (checked by its slopes above): the sides decide
            assert right < left, (left, right)
            for r in cp.rhos:  # ρ₀ mirrored (Θ's nodes are sorted and symmetric): c(ρ) of the other sign
                cp.theta.set_values(r, cp.theta.gather_values(r)[::-1])
            assert certificate_bound(cp)[0] is (not expected and right * left > 0), certificate_bound(cp)
    run = mfpde.train(gauss, tempdir / "g")
    assert run.report["rate"]["certificate_bound"] is True and "certificate" in run.report["rate"], run.report["rate"]
    # the kink test on a made-up problem: ŷ(c) = ŷ0 + c s± with the slope of each side given
    targets = np.array([1.0, -1.0])

    def problem(y_minus, y0, y_plus, c=0.3):
        ys = {-1.0: np.array(y_minus), 0.0: np.array(y0), 1.0: np.array(y_plus)}
        obj = SimpleNamespace(predict=lambda samples, heads: ys[float(heads[0].c[0])])
        train = [SimpleNamespace(target=t) for t in targets]
        return SimpleNamespace(problem=SimpleNamespace(shallow=True, train=train),
                               state=SimpleNamespace(lam=0.1), family=SimpleNamespace(name="value", p=1,
                                                                                       a=lambda th: np.full(1, 0.5)),
                               objective=obj, theta=SimpleNamespace(points=np.linspace(-2, 2, 9)[:, None]),
                               heads=lambda: [SimpleNamespace(abar=c)])

    # residuals r0 = (−1, 1); R'(0⁺) = mean(r0 (ŷ(1) − ŷ(0))) = 1 ≥ R'(0⁻) = 0: convex
    assert certificate_bound(problem([0.0, 0.0], [0.0, 0.0], [-1.0, 1.0]))[0] is True
    # R'(0⁺) = −1 < R'(0⁻) = 0: 0 may be a local maximum of F, the minimiser's side unknown: not a bound
    bound, why = certificate_bound(problem([0.0, 0.0], [0.0, 0.0], [1.0, -1.0]))
    assert bound is False and "not convex" in why
    # R'(0⁺) = −1 < R'(0⁻) = −0.5 < 0: F falls through c = 0, the minimiser has c* > 0: a bound where c(ρ) > 0
    assert certificate_bound(problem([-0.5, 0.5], [0.0, 0.0], [1.0, -1.0], c=0.3))[0] is True
    assert certificate_bound(problem([-0.5, 0.5], [0.0, 0.0], [1.0, -1.0], c=-0.3))[0] is False
    scalar = SimpleNamespace(problem=SimpleNamespace(shallow=True), state=SimpleNamespace(lam=0.1),
                             family=SimpleNamespace(name="scalar"))
    bound, why = certificate_bound(scalar)
    assert bound is False and "not a bound" in why


def test_free_energy_rise_beyond_roundoff_is_a_warning_with_its_step():
    """An entropic run's F rose in 8 of its last 15 rows, silently. A rise larger than the round-off of F's sums
    (over n samples and N_θ nodes) is a warning naming its steps; one at round-off is not."""
    from types import SimpleNamespace

    from mfpde.training.report import free_energy_rises

    cp = SimpleNamespace(problem=SimpleNamespace(train=[0] * 10), state=SimpleNamespace(n_layers=1, lam=1e-3),
                         theta=SimpleNamespace(points=np.zeros((90, 2))))
    F = [0.5, 0.4, 0.3609, 0.360867, 0.360938]
    rows = [{"step": 20 * k, "risk": f - 0.01, "free_energy": f, "neg_entropy": -1.0} for k, f in enumerate(F)]
    (w,) = free_energy_rises(cp, rows)
    assert "1 pair(s)" in w and "from step 60 to 80" in w and "training.ds" in w, w
    eps_rise = 4 * 100 * np.finfo(float).eps * 0.372  # below the bound: (n + N_θ) = 100 terms, Σ|parts| ≈ 0.372
    rows[-1]["free_energy"] = rows[-2]["free_energy"] + 0.5 * eps_rise
    assert free_energy_rises(cp, rows) == []


@pytest.mark.parametrize("lam2", [0.0, 0.5])
def test_a_rising_risk_without_entropy_is_a_warning(lam2):
    """λ = 0: F is R + (λ₂/2)∫|θ|²dρ (the risk itself for λ₂ = 0), which the flow descends as well; a rise was not
    warned (only entropic runs were checked). Now it is, naming what rose."""
    from types import SimpleNamespace

    from mfpde.training.report import free_energy_rises

    cp = SimpleNamespace(problem=SimpleNamespace(train=[0] * 10), state=SimpleNamespace(n_layers=1, lam=0.0, lam2=lam2),
                         theta=SimpleNamespace(points=np.zeros((90, 2))))
    R = [0.5, 0.3, 0.2, 0.25, 0.24]
    rows = [{"step": k, "risk": r, "free_energy": r + lam2 * 0.1, "neg_entropy": -1.0} for k, r in enumerate(R)]
    (w,) = free_energy_rises(cp, rows)
    assert w.startswith("training.ds: the " + ("risk (λ = λ₂ = 0)" if lam2 == 0 else "objective R + (λ₂/2)"))
    assert "from step 2 to 3" in w


def test_accuracy_against_the_better_sign_of_rho0s_readout():
    """3 vs 8 "learned" 0.211 → 0.789 = 1 − 0.211: the sign of ρ₀'s readout flipped. The report gives the better of
    ρ₀ and its sign flip (``initial_best_sign``), the gain over it, and warns when training only flipped a sign."""
    from mfpde.training.report import accuracy_block

    rng = np.random.default_rng(0)
    y = np.sign(rng.standard_normal(90))
    y0 = np.where(np.arange(90) < 19, 1.0, -1.0) * y * rng.uniform(0.1, 1.0, 90)  # 19 of 90 right: 0.211
    acc, warns = accuracy_block({"train": y, "test": y}, {"train": y0, "test": y0}, {"train": -2 * y0, "test": -y0})
    assert acc["initial"]["test"] == pytest.approx(19 / 90) and acc["test"] == pytest.approx(71 / 90)
    assert acc["initial_best_sign"]["test"] == pytest.approx(71 / 90) and acc["gain"]["test"] == 0.0
    assert acc["agrees_with_flipped_initial"]["test"] == 1.0
    (w,) = warns
    assert "only flipped a sign" in w, w
    better = np.where(np.arange(90) < 80, 1.0, -1.0) * y  # 80 of 90: a gain over 71/90
    acc, warns = accuracy_block({"train": y, "test": y}, {"train": y0, "test": y0}, {"train": better, "test": better})
    assert acc["gain"]["test"] == pytest.approx(9 / 90) and warns == []
    # nothing learned, nothing flipped (ŷ = ŷ₀): the warning says so instead of "only flipped a sign"
    acc, warns = accuracy_block({"train": y, "test": y}, {"train": y0, "test": y0}, {"train": y0, "test": y0})
    (w,) = warns
    assert acc["agrees_with_flipped_initial"]["test"] == 0.0 and "gained nothing" in w and "flipped a sign" not in w


#: How a .bp directory is damaged: (file, what is done to it). Before the checks: data.0 halved hung in ADIOS2,
#: md.idx empty was a SIGSEGV, md.idx halved read 2 of 7 steps, the others raised ADIOS2's RuntimeError or an
#: IndexError (or crashed: data.0 8 bytes short, mmd.0 cut).
DAMAGES = [("data.0", "half"), ("data.0", "cut8"), ("data.0", "empty"), ("md.idx", "half"), ("md.idx", "empty"),
           ("md.idx", "last"), ("md.0", "half"), ("md.0", "empty"), ("mmd.0", "half"), ("mmd.0", "empty"),
           ("md.0", "missing"), ("data.0", "missing")]

READ_ALL = '''
import sys
import mfpde
for p in sys.argv[1:]:
    try:
        f = mfpde.read_vtx(p)
        print(p, "read", len(f.times), flush=True)
    except mfpde.ConfigError as e:
        print(p, "ConfigError", str(e).replace(chr(10), " "), flush=True)
'''


def _damage(src: Path, dst: Path, name: str, how: str) -> None:
    import shutil

    shutil.copytree(src, dst)
    f = dst / name
    size = f.stat().st_size
    if how == "missing":
        f.unlink()
    elif how == "last":  # the index without its last step record: a valid index of one step fewer
        data = f.read_bytes()
        f.write_bytes(data[: len(data) - _last(data)])
    else:
        with open(f, "r+b") as fh:
            fh.truncate({"half": size // 2, "cut8": size - 8, "empty": 0}[how])


def _last(idx: bytes) -> int:
    """The length of the last record of a BP5 index (type byte, uint64 length, body)."""
    pos, last = 64, 0
    while pos < len(idx):
        last = 9 + int.from_bytes(idx[pos + 1: pos + 9], "little")
        pos += last
    return last


@pytest.mark.serial  # launches its own processes
@pytest.mark.parametrize("n", [1, 2])
def test_read_vtx_of_a_damaged_bp_is_a_config_error(tempdir, n):
    """Every damage of a 7-step ``.bp`` written on n ranks gives ConfigError naming the damaged file, without ANSI
    codes, within a budget; the whole file reads 7 steps."""
    import subprocess
    import sys

    from test_mpi_failures import MPIEXEC, ROOT, finish

    out = tempdir / "t"
    cmd = [*([MPIEXEC, "-n", str(n)] if n > 1 else []), sys.executable, "-m", "mfpde", "transport",
           str(ROOT / "demos" / "transport_small.toml"), "--quiet", "--set", "depth.steps=60", "--out", str(out)]
    proc = subprocess.Popen(cmd, cwd=ROOT, text=True, stderr=subprocess.PIPE, start_new_session=True)
    err = finish(proc, 180, "transport")
    assert proc.returncode == 0, err
    src = out / "fields" / "mu_0.bp"
    paths = [src]
    for i, (name, how) in enumerate(DAMAGES):
        paths.append(tempdir / f"d{i}.bp")
        _damage(src, paths[-1], name, how)
    proc = subprocess.Popen([sys.executable, "-c", READ_ALL, *map(str, paths)], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        got, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        import os
        import signal

        os.killpg(proc.pid, signal.SIGKILL)
        got, err = proc.communicate()
        pytest.fail(f"read_vtx hung on a damaged .bp after: {got}")
    lines = got.splitlines()
    assert proc.returncode == 0 and len(lines) == len(paths), (proc.returncode, got, err)
    assert lines[0].split()[1:] == ["read", "7"], lines[0]
    for line, (name, how) in zip(lines[1:], DAMAGES, strict=True):
        assert line.split()[1] == "ConfigError" and f"/{name}'" in line and "\x1b" not in line, (name, how, line)


def _numbers(x, path=""):
    """Every number of a report as (path, value), lists and dicts flattened; booleans and strings kept too."""
    if isinstance(x, dict):
        for k, v in x.items():
            yield from _numbers(v, f"{path}.{k}")
    elif isinstance(x, list):
        for i, v in enumerate(x):
            yield from _numbers(v, f"{path}[{i}]")
    else:
        yield path, x


#: Timings and the rank count itself: the only report numbers allowed to differ with the ranks.
RANK_DEPENDENT = re.compile(r"(wall_s|_cpu_s|comm_size)$")
#: Short transports of each domain; the sphere's limits cells (its count was rank 0's: 413108 on 1 rank, 205132 on 2).
SHORT = {"box": ("transport_small.toml", []),
         "circle": ("circle.toml", ["depth.T=0.5", "depth.steps=10", "tokens.cells=[64]"]),
         "sphere": ("sphere.toml", ["depth.T=10", "depth.steps=4", "tokens.refine=1"]),
         "sphere_flow": ("sphere.toml", ['tokens.solver="flow"', "depth.T=6"]),
         # mfpde run, three samples split over the ranks: its tape block was rank 0's samples (substeps 113, 71, 46)
         "run": ("value_heads.toml", ["data.mean=[[0.3], [-0.5], [0.1]]", "data.cov=[[[0.25]], [[0.1]], [[0.2]]]",
                                      "data.target=[1.2, -0.4, 0.3]", "training.steps=6", "tokens.cells=[60]"])}
#: Strings that carry a round-off number (the NTK's smallest eigenvalue, ±1e-15 where it is 0).
ROUND_OFF_TEXT = re.compile(r"\.ntk\.warning$")


@pytest.mark.serial  # launches its own processes
@pytest.mark.parametrize("domain", sorted(SHORT))
def test_every_number_of_a_report_is_the_same_on_1_2_and_3_ranks(tempdir, domain):
    """Counts and sums are reduced over the ranks, not rank 0's: every number of report.json but the timings and
    comm_size agrees on 1, 2 and 3 ranks (integers exactly, floats to round-off of the reordered sums)."""
    import json
    import os
    import subprocess
    import sys

    from test_mpi_failures import MPIEXEC, finish

    demo, sets = SHORT[domain]
    reports = []
    for n in (1, 2, 3):
        out = tempdir / f"{domain}{n}"
        sets_ = [a for s in [*sets, "output.fields=false", "output.plots=false"] for a in ("--set", s)]
        command = "run" if domain == "run" else "transport"
        cmd = [MPIEXEC, "-n", str(n), sys.executable, "-m", "mfpde", command, str(ROOT / "demos" / demo), "--quiet",
               "--out", str(out), *sets_]
        proc = subprocess.Popen(cmd, cwd=ROOT, text=True, stderr=subprocess.PIPE, start_new_session=True,
                                env={**os.environ, "OMP_NUM_THREADS": "1"})
        err = finish(proc, 180, f"{command} {domain} on {n} ranks")
        assert proc.returncode == 0, err
        reports.append(dict(_numbers(json.loads((out / "report.json").read_text()))))
    one = reports[0]
    if domain == "sphere":
        assert one[".samples[0].limited_cells"] > 0  # the limiter acted: its count is compared
    for n, rep in zip((2, 3), reports[1:], strict=True):
        assert rep.keys() == one.keys(), (n, rep.keys() ^ one.keys())
        for k, v in one.items():
            if RANK_DEPENDENT.search(k) or ROUND_OFF_TEXT.search(k):
                continue
            w = rep[k]
            if isinstance(v, float) and not isinstance(v, bool):
                assert w == pytest.approx(v, rel=1e-9, abs=1e-12), (n, k, v, w)
            else:
                assert w == v, (n, k, v, w)


def test_sphere_cluster_counts_carry_a_resolution_check(tempdir, caplog):
    """The sphere's clusters are counted again at half the labels (flow) or one refinement fewer (DG); where the
    count at T or the merge times differ, the report and the log warn that they depend on the resolution (the flow
    solver at β = 9 counts 3 clusters at T with 512 labels and 2 with 288; nothing said so)."""
    import json

    sphere = str(ROOT / "demos" / "sphere.toml")
    out = tempdir / "flow"
    with caplog.at_level(logging.WARNING, logger="mfpde"):
        assert cli.main(["transport", sphere, "--out", str(out), "--set", 'tokens.solver="flow"', "--set",
                         "tokens.labels=512", "--set", "output.fields=false", "--set", "output.plots=false"]) == 0
    rep = json.loads((out / "report.json").read_text())
    check = rep["samples"][0]["resolution_check"]
    assert check["at"] == "288 particles" and check["clusters_T"] == 2 and rep["samples"][0]["clusters_T"] == 3
    assert check["agrees"] is False and len(rep["warnings"]) == 1
    assert rep["warnings"][0].startswith("tokens.labels: the clusters depend on the resolution")
    assert any(r.getMessage() == rep["warnings"][0] for r in caplog.records)
    out = tempdir / "dg"  # early depths: no cluster at either resolution, nothing to warn
    assert cli.main(["transport", sphere, "--out", str(out), "--set", "depth.T=2", "--set", "depth.steps=2", "--set",
                     "tokens.refine=1", "--set", "output.fields=false", "--set", "output.plots=false"]) == 0
    rep = json.loads((out / "report.json").read_text())
    assert rep["samples"][0]["resolution_check"] == {"at": "20 cells", "clusters_t": [0, 0], "clusters_T": 0,
                                                     "merge_times": [], "agrees": True}
    assert rep["warnings"] == []


def test_circle_cluster_counts_carry_a_resolution_check(tempdir, caplog):
    """The circle's clusters are counted again at half the labels (flow) or half the cells (DG); noisy data on 64
    cells read by 16 quantile labels merge at t = 5.5, by 8 labels at t = 3: the report and the log say so. The demo's
    three clusters are the same at half the labels: nothing to warn."""
    import json

    circle = str(ROOT / "demos" / "circle.toml")
    quiet = ["--set", "output.fields=false", "--set", "output.plots=false", "--set", 'tokens.solver="flow"']
    out = tempdir / "noise"
    with caplog.at_level(logging.WARNING, logger="mfpde"):
        assert cli.main(["transport", circle, "--out", str(out), *quiet, "--set", 'data.kind="circle_noise"',
                         "--set", "data.amplitude=0.05", "--set", "tokens.cells=[64]", "--set", "tokens.labels=16",
                         "--set", "depth.T=20", "--set", "depth.steps=40", "--set", "output.every=1"]) == 0
    rep = json.loads((out / "report.json").read_text())
    block = rep["samples"][0]
    check = block["resolution_check"]
    assert check["at"] == "8 labels" and check["agrees"] is False
    assert block["merge_times"] == [5.5] and check["merge_times"] == [3.0] and len(rep["warnings"]) == 1  # outputs.md
    assert rep["warnings"][0].startswith("tokens.labels: the clusters depend on the resolution")
    assert any(r.getMessage() == rep["warnings"][0] for r in caplog.records)
    out = tempdir / "demo"
    assert cli.main(["transport", circle, "--out", str(out), *quiet]) == 0
    rep = json.loads((out / "report.json").read_text())
    check = rep["samples"][0]["resolution_check"]
    assert check["at"] == "64 labels" and check["agrees"] is True and check["clusters_T"] == 3
    assert rep["warnings"] == []


def test_circle_noise_at_half_the_cells_is_the_pair_means_of_the_same_draw():
    """The DG resolution check draws ``circle_noise`` on the job's cells and gives each coarser cell its pair's mean:
    the same data, coarser (a fresh draw on half the cells would be other data)."""
    import numpy as np

    from mfpde.tokens.circle.dg import CircleMesh
    from mfpde.tokens.circle.diag import initial_density

    fine = initial_density(CircleMesh(64, 0), "circle_noise", amplitude=0.3, seed=7)[:, 0]
    coarse = initial_density(CircleMesh(32, 1), "circle_noise", amplitude=0.3, seed=7, data_cells=64)
    assert np.array_equal(coarse[:, 0], coarse[:, 1])  # constant on each cell
    np.testing.assert_allclose(coarse[:, 0], fine.reshape(32, 2).mean(axis=1), rtol=4 * np.finfo(float).eps)
    with pytest.raises(ValueError, match="not a multiple"):
        initial_density(CircleMesh(24, 0), "circle_noise", amplitude=0.3, seed=7, data_cells=64)


def test_a_resolution_check_that_could_not_run_says_so(caplog):
    """A coarser solve that fails numerically leaves the job's result alone and warns that the counts were not
    checked (it was silent); the sphere's flow solver has no coarser resolution below twice its fewest labels (at
    32 labels the check solved at 16, which the config refuses, and warned of a difference)."""
    import dataclasses

    from mfpde import config as C
    from mfpde.errors import NumericalError
    from mfpde.tokens.resolution import Coarser, resolution_check
    from mfpde.tokens.sphere.config import LABELS_RANGE, coarser, section

    block = {"clusters_T": 2, "merge_times": [1.0]}

    def fails(cfg, **kw):
        raise NumericalError("overflow at t = 0.5")

    with caplog.at_level(logging.WARNING, logger="mfpde"):
        warnings = resolution_check(block, Coarser(None, "tokens.cells", "32 cells", "64 cells"), fails)
    assert block["resolution_check"] == {"at": "32 cells", "agrees": None,
                                         "reason": "the coarser solve failed: overflow at t = 0.5"}
    assert len(warnings) == 1 and warnings[0].startswith("tokens.cells: the cluster counts were not checked")
    assert any(r.getMessage() == warnings[0] for r in caplog.records)
    cfg = C.load(str(ROOT / "demos" / "sphere.toml"), ['tokens.solver="flow"'])
    lo = LABELS_RANGE[0]
    for labels in (lo, 2 * lo - 1):
        assert coarser(dataclasses.replace(section(cfg), labels=labels)) is None
    half = coarser(dataclasses.replace(section(cfg), labels=2 * lo))
    assert half is not None and half.config.labels == lo and half.at == "32 particles"
