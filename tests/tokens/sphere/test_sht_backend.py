"""The sphere's harmonic transforms by ducc0 (the optional extra ``mfpde[ducc]``) against the numpy reference.

Round-off bound. Both paths sum (L+1)² terms g_k Y_k(x) with |Y_k| ≤ √((2L+1)/4π); the numpy recurrences lose
O(L) ε per term, ducc0's non-uniform FFT is asked for a relative error :data:`~mfpde.tokens.sphere.sht.EPSILON`
(1e-14 ≤ 50 ε). So the values differ by at most 50 (L+1) ε Σ|g| (and the coefficients of an analysis by
50 (L+1) ε Σ|w|); a surface gradient carries a factor ℓ ≤ L more: 50 (L+1)² ε Σ|g|. Measured: 10–100× below.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from mfpde.errors import ConfigError
from mfpde.tokens.sphere import harmonics, sht

EPS = np.finfo(float).eps
ROOT = Path(__file__).resolve().parents[3]


def _points(rng: np.random.Generator, n: int) -> np.ndarray:
    x = rng.normal(size=(n, 3))
    x[:4] = [[0, 0, 1], [0, 0, -1], [1e-9, 0, 1], [1, 0, 0]]  # the poles, next to one, the seam φ = 0
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_backend_follows_the_environment(monkeypatch):
    """MFPDE_SHT picks the backend; a bad value, or ducc0 asked for where it is missing, is a ConfigError (exit 2
    at the command's start, below), and so is a bad MFPDE_SHT_THREADS."""
    import importlib.util

    from mfpde.environment import sht_threads

    monkeypatch.setenv(sht.ENV, "numpy")
    assert sht.backend() == "numpy"
    monkeypatch.setenv(sht.ENV, "fftw")
    with pytest.raises(ConfigError, match="^MFPDE_SHT: must be one of"):
        sht.backend()
    monkeypatch.setattr(sht, "_ducc0", lambda: None)  # as without ducc0 installed
    monkeypatch.delenv(sht.ENV)
    assert sht.backend() == "numpy"
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ducc0" else real(name, *a))
    monkeypatch.setenv(sht.ENV, "ducc0")
    with pytest.raises(ConfigError, match=r"^MFPDE_SHT: ducc0 is asked for but not installed \(pip install"):
        sht.backend()
    for bad in ("0", "x", "100000"):
        with pytest.raises(ConfigError, match="^MFPDE_SHT_THREADS: must be an integer"):
            sht_threads({"MFPDE_SHT_THREADS": bad})
    assert sht_threads({}) == 1 and sht_threads({"MFPDE_SHT_THREADS": "4"}) == 4


@pytest.mark.parametrize("var,value", [("MFPDE_SHT", "fftw"), ("MFPDE_SHT_THREADS", "-3")])
def test_a_bad_transform_variable_is_refused_before_anything_is_written(tmp_path, capsys, monkeypatch, var, value):
    """Read mid-solve by the sphere's kernel, the variables are checked at the start: exit 2, one line, no DIR."""
    from mfpde.cli import main

    monkeypatch.setenv(var, value)
    out = tmp_path / "o"
    assert main(["transport", str(ROOT / "demos" / "sphere.toml"), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{var}: must be" in err[0] and not out.exists()


def test_numpy_backend_is_the_reference_exactly(monkeypatch):
    monkeypatch.setenv(sht.ENV, "numpy")
    rng = np.random.default_rng(0)
    x, L = _points(rng, 300), 7
    g, w = rng.normal(size=(L + 1) ** 2), rng.normal(size=(2, 300))
    f, d = sht.synthesis(L, g, x, gradient=True)
    f0, d0 = harmonics.synthesis(L, g, x, gradient=True)
    assert d is not None and d0 is not None
    assert np.array_equal(f, f0) and np.array_equal(d, d0)
    assert np.array_equal(sht.analysis(L, x, w), harmonics.analysis(L, x, w))
    with pytest.raises(ValueError, match="L must be"):
        sht.synthesis(-1, g, x)


def test_ducc_layout_round_trips():
    rng = np.random.default_rng(1)
    for L in range(6):
        g = rng.normal(size=(3, (L + 1) ** 2))
        a = sht.to_ducc(L, g)
        assert a.shape == (3, (L + 1) * (L + 2) // 2)
        assert np.array_equal(a[:, :L + 1].imag, np.zeros((3, L + 1)))  # m = 0: real
        assert np.allclose(sht.from_ducc(L, a), g, rtol=0, atol=4 * EPS)


@pytest.mark.parametrize("L", range(41))
def test_ducc_agrees_with_numpy_both_directions(L, monkeypatch):
    pytest.importorskip("ducc0")
    monkeypatch.setenv(sht.ENV, "ducc0")
    rng = np.random.default_rng(100 + L)
    x = _points(rng, 400)
    g = rng.normal(size=(L + 1) ** 2)
    w = rng.normal(size=(3, len(x)))
    f, d = sht.synthesis(L, g, x, gradient=True)
    f0, d0 = harmonics.synthesis(L, g, x, gradient=True)
    assert d is not None and d0 is not None
    tol = 50 * (L + 1) * EPS * np.abs(g).sum()
    assert np.abs(f - f0).max() <= tol, (np.abs(f - f0).max(), tol)
    assert np.abs(d - d0).max() <= (L + 1) * tol, (np.abs(d - d0).max(), (L + 1) * tol)
    assert np.abs(np.einsum("ij,ij->i", d, x)).max() <= (L + 1) * tol  # tangent
    a, a0 = sht.analysis(L, x, w), harmonics.analysis(L, x, w)
    assert a.shape == a0.shape == (3, (L + 1) ** 2)
    atol = 50 * (L + 1) * EPS * np.abs(w).sum(axis=1, keepdims=True)
    assert np.all(np.abs(a - a0) <= atol), np.abs(a - a0).max()
    assert np.allclose(sht.analysis(L, x, w[0]), a[0], rtol=0, atol=0)  # one set of weights: shape ((L+1)²,)
    # the adjoint identity ⟨S g, v⟩ = ⟨g, S* v⟩ of the ducc0 pair itself
    lhs, rhs = f @ w[0], g @ a[0]
    assert abs(lhs - rhs) <= 100 * (L + 1) * EPS * np.abs(g).sum() * np.abs(w[0]).sum(), (lhs, rhs)


def test_ducc_takes_few_points_and_none_by_numpy(monkeypatch):
    pytest.importorskip("ducc0")
    monkeypatch.setenv(sht.ENV, "ducc0")
    rng = np.random.default_rng(3)
    g = rng.normal(size=25)
    x = _points(rng, sht.MIN_POINTS - 1)
    assert np.array_equal(sht.synthesis(4, g, x)[0], harmonics.synthesis(4, g, x)[0])
    assert sht.synthesis(4, g, np.zeros((0, 3)))[0].shape == (0,)
    f, d = sht.synthesis(0, g[:1], _points(rng, 100), gradient=True)
    assert d is not None and np.array_equal(d, np.zeros((100, 3))) and np.allclose(f, g[0] / np.sqrt(4 * np.pi))


def _report(out: Path) -> dict[str, object]:
    def flat(v: object, path: str = "") -> dict[str, object]:
        if isinstance(v, dict):
            return {k: x for key, val in v.items() for k, x in flat(val, f"{path}.{key}").items()}
        if isinstance(v, list):
            return {k: x for i, val in enumerate(v) for k, x in flat(val, f"{path}[{i}]").items()}
        return {path: v}
    return flat(json.loads((out / "report.json").read_text()))


def test_sphere_transport_reports_the_same_numbers_with_ducc_and_numpy(tempdir, monkeypatch):
    """The DG demo (its harmonic kernel at β = 9, softmax) in short: every report number but the timings agrees to
    round-off (rel 1e-9: the ranks test's tolerance) whichever backend evaluates the kernel."""
    pytest.importorskip("ducc0")
    from mfpde import cli

    sets = ["depth.T=10", "depth.steps=4", "tokens.refine=1", "output.fields=false", "output.plots=false"]
    reports = {}
    for name in ("numpy", "ducc0"):
        monkeypatch.setenv(sht.ENV, name)
        out = tempdir / name
        args = ["transport", str(ROOT / "demos" / "sphere.toml"), "--quiet", "--out", str(out)]
        assert cli.main([*args, *[a for s in sets for a in ("--set", s)]]) == 0
        reports[name] = _report(out)
    one, two = reports["numpy"], reports["ducc0"]
    assert one.keys() == two.keys() and one[".samples[0].kernel"] == "harmonic"
    for k, v in one.items():
        if k.endswith(("wall_s", "_cpu_s")):
            continue
        if isinstance(v, float):
            assert two[k] == pytest.approx(v, rel=1e-9, abs=1e-12), (k, v, two[k])
        else:
            assert two[k] == v, (k, v, two[k])
