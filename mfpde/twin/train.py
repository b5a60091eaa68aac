"""Training the finite network's heads: Langevin (the particle system of theory §4), plain SGD, or Adam.

Langevin is Euler–Maruyama of dθ_h = −(H ∇_{θ_h} R_H + λ₂ θ_h) ds + √(2λ) dB_h with the step Δs of the PDE run
(λ = 0 for Tikhonov): the particle version of the Fokker–Planck equation the PDE solves. ``sgd`` is the same
step without noise; ``adam`` is optax's Adam on R_H + (λ₂/2)(1/H)Σ|θ_h|² at the learning rate ``twin.lr``
(a practitioner's training, reported beside the others, not used for rates).

The seeds of one size are one ``vmap``: every seed's heads, tokens and Brownian increments come from its own
key (the seed and the size), so a size gives the same numbers on any rank and whatever other sizes run.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import numpy.typing as npt
import optax

from mfpde.twin.network import Network

__all__ = ["Hyper", "TwinHistory", "train_twin"]

Array = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Hyper:
    """The training of the twin: Δs, steps, output cadence, regularisation and optimiser."""

    ds: float
    steps: int
    every: int
    lam: float
    lambda2: float
    optimizer: str = "langevin"
    lr: float = 0.01


@dataclass
class TwinHistory:
    """What one size's seeds recorded, at the output steps (``steps``) and at the end.

    Attributes:
        steps: the output steps, (m,).
        risk, test_risk, train_acc, test_acc: per seed and output step, (S, m) (NaN where there is no held-out set).
        heads: the heads at each output step, (m, S, K, H, p).
        yhat: ŷ of the training samples per seed at each output step, (S, m, n).
        tokens_T: the tokens at depth T of the traced samples at the last step, (S, k, N, d); weights (S, k, N).
        failed: "" or why a seed's risk stopped being finite (the history then ends at the last good step).
        diverged: some seed's risk left :data:`DIVERGED_FACTOR` × its initial risk (or every bound): that seed was
            held at its last state from then on.
    """

    steps: Array
    risk: Array
    test_risk: Array
    train_acc: Array
    test_acc: Array
    heads: Array
    yhat: Array
    tokens_T: Array = field(default_factory=lambda: np.zeros(0))
    token_weights: Array = field(default_factory=lambda: np.zeros(0))
    failed: str = ""
    diverged: bool = False
    cpu_s: float = math.nan


#: Training steps between two polls of ``stop`` (a signal ends the training within about this many steps).
POLL_STEPS = 5
#: A seed whose risk exceeds this multiple of its initial risk, or is not finite, has diverged: it is held there.
DIVERGED_FACTOR = 1e6


def _accuracy(yh: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.mean((jnp.sign(yh) == jnp.sign(y)).astype(jnp.float64))


def train_twin(net: Network, hyper: Hyper, theta0: Array, data: dict[str, Array], key: jax.Array,
               trace: list[int] | None = None, on_output: Callable[[int], None] | None = None,
               stop: Callable[[], bool] | None = None) -> TwinHistory:
    """Train S seeds of one size together.

    Args:
        net: the network (:func:`mfpde.twin.network.make_network`).
        hyper: the training.
        theta0: initial heads per seed, (S, K, H, p).
        data: ``x``, ``w`` (S, n, N, d), (S, n, N) training tokens per seed, or (n, N, d), (n, N) shared by the
            seeds; ``y`` (n,); ``x_test``, ``w_test``, ``y_test`` likewise (may be empty).
        key: the seeds' keys, (S, 2) (``jax.random.split``).
        trace: training samples whose tokens at depth T are kept (last step).
        on_output: called with the step after each output step (progress).
        stop: polled before each step; True ends the training there (a signal), the history up to it kept.

    Returns:
        The history. A non-finite risk or head ends the training at the last output step where every seed was
        finite (``failed`` says at which step).
    """
    H = theta0.shape[2]
    shared = np.ndim(data["x"]) == 3  # the same tokens for every seed (quantile, limit): not copied per seed
    ax = None if shared else 0
    grad_seeds = jax.vmap(net.risk_grad, in_axes=(0, ax, ax, None))
    yhat_seeds = jax.vmap(net.yhat, in_axes=(0, ax, ax))
    lam, l2, ds = hyper.lam, hyper.lambda2, hyper.ds
    if hyper.optimizer == "adam":
        opt = optax.adam(hyper.lr)
    prep = net.prepare if shared else jax.vmap(net.prepare)
    w, y = jnp.asarray(data["w"]), jnp.asarray(data["y"])
    x = prep(jnp.asarray(data["x"]), w)
    has_test = data["y_test"].size > 0
    wt, yt = jnp.asarray(data["w_test"]), jnp.asarray(data["y_test"])
    xt = prep(jnp.asarray(data["x_test"]), wt) if has_test else jnp.asarray(data["x_test"])

    cap = DIVERGED_FACTOR * jnp.maximum(grad_seeds(jnp.asarray(theta0), x, w, y)[0], 1e-300)

    Carry = tuple[jax.Array, Any, jax.Array, jax.Array]

    def step(carry: Carry, _: Any) -> tuple[Carry, None]:
        theta, state, keys, frozen = carry
        keys = jax.vmap(lambda kk: jax.random.split(kk)[0])(keys)
        risk, g = grad_seeds(theta, x, w, y)
        force = H * g + l2 * theta  # ∇_θ δR/δρ + λ₂ θ at each head (theory §12)
        if hyper.optimizer == "adam":
            upd, new_state = jax.vmap(opt.update)(force / H, state)
            new = theta + upd
        else:
            new, new_state = theta - ds * force, state
            if hyper.optimizer == "langevin" and lam > 0:
                noise = jax.vmap(lambda kk: jax.random.normal(jax.random.split(kk)[1], theta.shape[1:]))(keys)
                new = new + jnp.sqrt(2 * lam * ds) * noise
        # a seed whose risk left every bound (the explicit step unstable) is held at its last state, flagged
        bad = frozen | ~(jnp.isfinite(risk) & (risk < cap)) | ~jnp.all(jnp.isfinite(new), axis=(1, 2, 3))
        keep = bad[:, None, None, None]
        if hyper.optimizer == "adam":
            new_state = jax.tree_util.tree_map(
                lambda a, b: jnp.where(bad.reshape((-1,) + (1,) * (a.ndim - 1)), a, b), state, new_state)
        return (jnp.where(keep, theta, new), new_state, keys, bad), None

    @jax.jit(static_argnums=4)
    def advance(theta: jax.Array, state: Any, keys: jax.Array, frozen: jax.Array,
                n: int) -> Carry:
        return jax.lax.scan(step, (theta, state, keys, frozen), None, length=n)[0]

    @jax.jit
    def evaluate(theta: jax.Array) -> tuple[jax.Array, ...]:
        yh = yhat_seeds(theta, x, w)
        r = 0.5 * jnp.mean((yh - y) ** 2, axis=1)
        acc = jax.vmap(_accuracy, in_axes=(0, None))(yh, y)
        if has_test:
            yht = yhat_seeds(theta, xt, wt)
            rt = 0.5 * jnp.mean((yht - yt) ** 2, axis=1)
            acct = jax.vmap(_accuracy, in_axes=(0, None))(yht, yt)
        else:
            rt = acct = jnp.full(theta.shape[0], jnp.nan)
        return r, rt, acc, acct, yh

    theta = jnp.asarray(theta0)
    state = jax.vmap(opt.init)(theta) if hyper.optimizer == "adam" else None
    rec: dict[str, list[Any]] = {k: [] for k in ("steps", "risk", "test_risk", "train_acc", "test_acc", "heads",
                                                 "yhat")}
    failed, last_good = "", theta
    keys = jnp.asarray(key)
    frozen = jnp.zeros(theta.shape[0], bool)
    s = 0
    while True:
        r, rt, acc, acct, yh = (np.asarray(a) for a in evaluate(theta))
        if not (np.all(np.isfinite(r)) and np.all(np.isfinite(np.asarray(theta)))):
            failed = f"non-finite risk or heads of the twin at training step {s} (s = {s * ds:.6g})"
            theta = last_good
            break
        for k, v in zip(rec, (s, r, rt, acc, acct, np.asarray(theta), yh), strict=True):
            rec[k].append(v)
        last_good = theta
        if on_output is not None:
            on_output(s)
        if s >= hyper.steps or (stop is not None and stop()):
            break
        while True:  # to the next output step, polling for a stop: a stopped state is recorded above, then ends
            n = min(hyper.every - s % hyper.every, hyper.steps - s, POLL_STEPS)
            theta, state, keys, frozen = advance(theta, state, keys, frozen, n)
            s += n
            if not (s % hyper.every and s < hyper.steps) or (stop is not None and stop()):
                break
    diverged = bool(np.any(np.asarray(frozen)))
    hist = TwinHistory(np.asarray(rec["steps"], float), np.stack(rec["risk"], 1), np.stack(rec["test_risk"], 1),
                       np.stack(rec["train_acc"], 1), np.stack(rec["test_acc"], 1), np.stack(rec["heads"]),
                       np.stack(rec["yhat"], 1), failed=failed, diverged=diverged)
    if trace:
        sel = np.asarray(trace)
        xs, ws = (x[sel], w[sel]) if shared else (x[:, sel], w[:, sel])
        hist.tokens_T = np.asarray(jax.vmap(net.tokens, in_axes=(0, ax, ax))(theta, xs, ws))
        hist.token_weights = np.broadcast_to(np.asarray(ws), hist.tokens_T.shape[:3]).copy()
    return hist
