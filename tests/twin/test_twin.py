"""The twin (`mfpde twin`, mfpde.twin): the finite network's autodiff against finite differences, its inputs, the
comparison's W1 and fits, and the command end to end with its bad input, on 1-D Gaussian inputs (cheap)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from mpi4py import MPI

import numpy as np
import pytest

from mfpde.cli import main
from mfpde.fitting import fit_order

ROOT = Path(__file__).resolve().parents[2]
DEEP = str(ROOT / "demos" / "twin_deep.toml")
SMALL = ["heads.cells=[16, 20]", "training.steps=10", "output.every=5", "twin.heads=[4, 16]",
         "twin.tokens=[8, 16]", "twin.layers=[2, 4]", "twin.seeds=3", "twin.trace=1"]


def _spec(model="weight-tied", family="scalar", readout="linear", d=1, blocks=1):
    from mfpde.twin.network import NetworkSpec

    return NetworkSpec(model, family, 0.5, 1.0, blocks, readout, (1.3,) * d if readout == "linear" else (), 0.2)


@pytest.mark.parametrize("model,family,blocks", [("weight-tied", "scalar", 1), ("depth-indexed", "scalar", 2),
                                                 ("shallow", "value", 1), ("shallow", "scalar", 1),
                                                 ("weight-tied", "value", 1)])
def test_autodiff_gradient_passes_the_taylor_test(model, family, blocks):
    """|R(θ + εδ) − R(θ) − ε⟨∇R, δ⟩| falls at order 2 in ε: the autodiff gradient is the derivative of the risk."""
    from mfpde.twin.network import make_network

    rng = np.random.default_rng(0)
    net = make_network(_spec(model, family, blocks=blocks), 4)
    p = 1 if family == "value" else 2
    theta = rng.normal(0.3, 0.3, (blocks, 5, p))
    x = net.prepare(rng.normal(0, 0.7, (3, 12, 1)), np.full((3, 12), 1 / 12))
    w, y = np.full((3, 12), 1 / 12), np.array([1.0, -0.5, 0.2])
    r0, g = (np.asarray(a) for a in net.risk_grad(theta, x, w, y))
    delta = rng.normal(size=theta.shape)
    eps = 1e-2 / 2.0 ** np.arange(4)
    rem = [abs(float(net.risk_grad(theta + e * delta, x, w, y)[0]) - r0 - e * float((g * delta).sum())) for e in eps]
    assert fit_order(eps, rem) == pytest.approx(2.0, abs=0.1)


def test_hoisted_single_layer_is_the_network():
    """The single layer of value heads computes its softmax once (prepare): the same ŷ as every head's attention."""
    import jax.numpy as jnp

    from mfpde.twin import network as nw

    rng = np.random.default_rng(1)
    spec = _spec("shallow", "value")
    x, w = rng.normal(0, 0.7, (12, 1)), np.full(12, 1 / 12)
    theta = rng.normal(0.3, 0.3, (1, 6, 1))
    hoisted = nw._forward(spec, 1, jnp.asarray(theta), nw._prepare(spec, jnp.asarray(x), jnp.asarray(w)),
                          jnp.asarray(w))[0]
    direct = x + spec.T * nw._velocity(spec, jnp.asarray(theta[0]), jnp.asarray(x), jnp.log(jnp.asarray(w)))
    assert float(hoisted) == pytest.approx(float(jnp.sum(w * (direct[:, 0] * 1.3 + 0.2))), rel=1e-14)


def test_token_limit_is_exact_for_the_pixel_measure():
    """The limit rule of an image integrates polynomials of degree ≤ 3 per axis exactly: its mean and second
    moments are those of the piecewise-constant density (closed form per pixel)."""
    from mfpde.tokens.box.data import Sample
    from mfpde.twin.tokens import input_tokens

    img = np.zeros((8, 8))
    img[2:5, 3] = [4.0, 16.0, 7.0]
    img[6, 1] = 2.0
    s = Sample("image", {"image": img, "origin": (-0.5, -0.5)}, 1.0)
    x, w = input_tokens([s], 0, "limit", np.random.default_rng(0))
    i, j = np.nonzero(img)
    m = img[i, j] / img.sum()
    cx, cy = -0.5 + (j + 0.5) / 8, -0.5 + 1 - (i + 0.5) / 8
    assert w.sum() == pytest.approx(1.0, abs=1e-15)
    assert (w[0] @ x[0, :, 0], w[0] @ x[0, :, 1]) == pytest.approx((m @ cx, m @ cy), abs=1e-15)
    assert w[0] @ x[0, :, 0] ** 2 == pytest.approx(m @ (cx**2 + 1 / 768), abs=1e-15)  # + the pixel's variance h²/12
    xq, wq = input_tokens([s], 4096, "quantile", np.random.default_rng(0))
    assert abs(wq[0] @ xq[0, :, 0] - m @ cx) < 1 / 4096 + 1 / 8 / 4096  # stratified: O(1/N)


def test_w1_of_shifted_quantile_heads_is_the_shift():
    """W1 between the heads at the quantiles of ρ shifted by δ and ρ is δ, up to the 1/(2H) of the quantile rule
    and the h/(4·SUBCELLS) of ρ's quadrature."""
    from scipy.stats import norm

    from mfpde.twin.compare import SUBCELLS, w1_heads

    xs = np.linspace(-4, 4, 161)
    rho = norm.pdf(xs, 0.2, 0.5)
    H, delta = 4000, 0.15
    heads = norm.ppf((np.arange(H) + 0.5) / H, 0.2 + delta, 0.5)[:, None]
    tol = 8 * 0.5 / (2 * H) + (xs[1] - xs[0]) / (4 * SUBCELLS)  # the quantile rule's W1 ≤ σ·(support)/(2H)
    assert w1_heads(heads, xs[:, None], rho) == pytest.approx(delta, abs=tol)


def test_fit_gaps_flags_what_the_pde_error_decides():
    from mfpde.twin.compare import fit_gaps

    rng = np.random.default_rng(3)
    sizes = [4, 16, 64, 256]
    gaps = np.stack([np.abs(rng.normal(0, 1 / math.sqrt(H), 64)) for H in sizes])
    f = fit_gaps(sizes, gaps, 0.0, -0.5)
    assert abs(f["slope"] + 0.5) < 4 * f["se"] and all(f["fitted"])
    g = fit_gaps(sizes, gaps, 0.03, -0.5)  # E|gap| = 0.8/√H: 2 × 0.03 is above H = 256 (0.05), below H = 64 (0.1)
    assert g["fitted"] == [True, True, True, False] and "left out" in g["note"] and "256" in g["note"]
    assert fit_gaps(sizes, gaps, 1.0, -0.5)["slope"] is None


@pytest.mark.serial
def test_twin_command_end_to_end(tmp_path):
    out = tmp_path / "tw"
    args = ["twin", DEEP, "--out", str(out), "--quiet"] + [a for s in SMALL for a in ("--set", s)]
    assert main(args) == 0
    if MPI.COMM_WORLD.rank:
        return
    rep = json.loads((out / "report.json").read_text())
    assert rep["status"] == "ok"
    assert set(rep["exponents"]) == {"heads", "tokens", "layers"}
    h = rep["exponents"]["heads"]["risk"]
    assert h["sizes"] == [4, 16] and h["expected"] == -0.5 and len(h["gaps"]) == 2
    assert rep["pde"]["discretisation_error"]["risk"] < 1e-4  # DG1 on 96 and 192 cells: far below the gaps
    lines = (out / "history.csv").read_text().splitlines()
    assert lines[0].startswith("sweep,heads,tokens,layers,seed,step")
    assert len(lines) - 1 == 3 * 3 * (2 + 2 + 2)  # seeds × output steps × the sizes of the three sweeps
    for f in ("gaps.png", "risk.png", "heads.png"):
        assert (out / "plots" / f).stat().st_size > 10_000
    # the same problem read back with --pde: the same gaps to the bit
    again = tmp_path / "again"
    assert main(["twin", DEEP, "--pde", str(out / "pde"), "--out", str(again), "--quiet"]
                + [a for s in SMALL for a in ("--set", s)]) == 0
    rep2 = json.loads((again / "report.json").read_text())
    assert rep2["exponents"] == rep["exponents"]


@pytest.mark.parametrize("sets,key", [
    (["twin.seeds=1"], "twin.seeds"), (["twin.heads=[]"], "twin.heads"), (["twin.tokens=[0, 4]"], "twin.tokens"),
    (["twin.layers=[-2]"], "twin.layers"), (["twin.optimizer='lbfgs'"], "twin.optimizer"),
    (["twin.sampling='sobol'"], "twin.sampling"), (["twin.heads=[100000]", "twin.tokens=[100000]"], "GiB"),
    (["heads.init={kind = 'diracs', points = [[0.1, 0.2]], weights = [1.0]}"], "heads.init"),
    (["twin.lr=0.1"], "twin.lr"), (["depth.model='shallow'", "twin.layers=[1, 2]"], "twin.layers"),
    (["output.every=7"], "--pde"),
])
def test_bad_twin_input_exits_2_naming_the_key(tmp_path, capsys, sets, key):
    out = tmp_path / "bad"
    pde = ["--pde", str(ROOT / "tests" / "twin" / "no-such-run")] if key == "--pde" else []
    assert main(["twin", DEEP, "--out", str(out), *pde] + [a for s in sets for a in ("--set", s)]) == 2
    err = capsys.readouterr().err
    if MPI.COMM_WORLD.rank == 0:
        assert key in err and len(err.strip().splitlines()) == 1
    assert not (out / "report.json").exists()


def test_twin_refuses_another_problems_pde_run(tmp_path, capsys):
    fake = tmp_path / "pde"
    fake.mkdir()
    (fake / "config.toml").write_text('[tokens]\ndim = 1\n')
    assert main(["twin", DEEP, "--pde", str(fake), "--out", str(tmp_path / "o")]) == 2
    assert "--pde" in capsys.readouterr().err or MPI.COMM_WORLD.rank


@pytest.mark.serial
def test_sigterm_ends_with_exit_4_and_what_was_finished(tmp_path):
    """SIGTERM while the twins train: the current size ends, the finished ones are compared and written, exit 4."""
    import os
    import signal
    import subprocess
    import sys
    import time

    if MPI.COMM_WORLD.size > 1:
        pytest.skip("launches its own process")
    out = tmp_path / "sig"
    cmd = [sys.executable, "-m", "mfpde", "twin", DEEP, "--out", str(out)] + [a for s in SMALL for a in ("--set", s)]
    p = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert p.stderr is not None
    t0 = time.monotonic()
    for line in p.stderr:  # the first size trained: the PDE runs are done
        if "twin: H = " in line:
            p.send_signal(signal.SIGTERM)
            break
        assert time.monotonic() - t0 < 600
    rest = p.stderr.read()
    assert p.wait(timeout=600) == 4, rest
    rep = json.loads((out / "report.json").read_text())
    assert rep["status"] == "interrupted" and "SIGTERM" in rep["interrupted_by"]
    assert (out / "history.csv").exists() and rep["sizes"]
