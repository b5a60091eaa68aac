"""The finite network of theory §1.1 in JAX: N tokens, H heads per layer, L residual attention layers.

    x_i^{ℓ+1} = x_i^ℓ + (T/L) (1/H) Σ_h v_h Σ_j w_j y_j e^{a_h x_i·y_j} / Σ_j w_j e^{a_h x_i·y_j},   y_j = x_j^ℓ,

with A = a I_d and V = v I_d (the head families of :mod:`mfpde.params.family`: θ = (a, v) or θ = v at a fixed a),
the input μ^N = Σ_j w_j δ_{x_j} (w_j = 1/N for a sampled input; quadrature weights for the token limit), and the
readout ŷ = Σ_j w_j g(x_j^L). Models (``depth.model``): ``shallow`` (one layer of depth T, ŷ linear in the head
measure), ``weight-tied`` (the same heads in every layer) and ``depth-indexed`` (K blocks of heads, layer ℓ uses
block ⌊ℓK/L⌋). The empirical risk R_H(θ_1..θ_H) = (1/n) Σ_i ½(ŷ^i − y^i)² is differentiated by
``jax.value_and_grad``: H ∇_{θ_h} R_H is ∇_θ δR/δρ at θ_h (theory §12). Nothing here uses mfpde's adjoint.

Pure functions of arrays (float64): :func:`make_network` returns the jitted maps for one model and family.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402

__all__ = ["Network", "NetworkSpec", "make_network"]


@dataclass(frozen=True)
class NetworkSpec:
    """What the finite network mirrors of a config.

    Attributes:
        model: ``"shallow"``, ``"weight-tied"`` or ``"depth-indexed"``.
        family: ``"value"`` (θ = v, A = a_fixed I) or ``"scalar"`` (θ = (a, v)).
        a_fixed: the attention parameter of value heads.
        T: the depth.
        blocks: head blocks K (depth-indexed; 1 otherwise).
        readout: ``"linear"`` (g = w·x + b), ``"mean"`` (g = x_1) or ``"second_moment"`` (g = |x|²).
        w, b: the linear readout's weights and offset.
    """

    model: str
    family: str
    a_fixed: float
    T: float
    blocks: int
    readout: str
    w: tuple[float, ...]
    b: float

    @property
    def p(self) -> int:
        """The dimension of Θ."""
        return 1 if self.family == "value" else 2


def _attention_mean(x: jax.Array, logw: jax.Array, a: jax.Array) -> jax.Array:
    """E_{π_x}[y] per head: shape (H, N, d) for tokens x (N, d), log-weights (N,), a (H,)."""
    gram = x @ x.T  # (N, N)
    logits = a[:, None, None] * gram[None] + logw[None, None, :]
    p = jax.nn.softmax(logits, axis=-1)  # (H, N, N)
    return p @ x  # (H, N, d)


def _velocity(spec: NetworkSpec, theta: jax.Array, x: jax.Array, logw: jax.Array) -> jax.Array:
    """(1/H) Σ_h v_θh(x, μ^N) at the tokens, shape (N, d); θ of one block, shape (H, p)."""
    if spec.family == "value":  # every head attends alike: the mean of v times one softmax mean (exact)
        m = _attention_mean(x, logw, jnp.asarray([spec.a_fixed]))[0]
        return jnp.mean(theta[:, 0]) * m
    m = _attention_mean(x, logw, theta[:, 0])
    return jnp.einsum("h,hnd->nd", theta[:, 1], m) / theta.shape[0]


def _readout(spec: NetworkSpec, x: jax.Array, w: jax.Array) -> jax.Array:
    if spec.readout == "linear":
        g = x @ jnp.asarray(spec.w) + spec.b
    elif spec.readout == "mean":
        g = x[:, 0]
    else:
        g = jnp.sum(x * x, axis=1)
    return jnp.sum(w * g)


def _hoisted(spec: NetworkSpec) -> bool:
    """Whether the attention is the same at every step of training: one layer of value heads (a fixed)."""
    return spec.model == "shallow" and spec.family == "value"


def _prepare(spec: NetworkSpec, x: jax.Array, w: jax.Array) -> jax.Array:
    """The network's input of one sample: x (N, d), or [x, E_{π_x}[y]] (N, 2d) where the attention is hoisted."""
    if not _hoisted(spec):
        return x
    return jnp.concatenate([x, _attention_mean(x, jnp.log(w), jnp.asarray([spec.a_fixed]))[0]], axis=1)


def _forward(spec: NetworkSpec, layers: int, theta: jax.Array, x: jax.Array, w: jax.Array) -> tuple[jax.Array,
                                                                                                    jax.Array]:
    """(ŷ, x_L) of one input: θ (K, H, p), input x (N, d) (:func:`_prepare`), weights w (N,) summing to 1."""
    logw = jnp.log(w)
    if _hoisted(spec):  # the single layer's softmax does not depend on θ: computed once by prepare
        d = x.shape[1] // 2
        xT = x[:, :d] + spec.T * jnp.mean(theta[0, :, 0]) * x[:, d:]
        return _readout(spec, xT, w), xT
    if spec.model == "shallow":
        xT = x + spec.T * _velocity(spec, theta[0], x, logw)
        return _readout(spec, xT, w), xT
    dt = spec.T / layers
    block = (jnp.arange(layers) * spec.blocks) // layers

    @jax.checkpoint  # the backward pass recomputes a layer's attention: memory of one layer, not of L
    def layer(xl: jax.Array, k: jax.Array) -> tuple[jax.Array, None]:
        return xl + dt * _velocity(spec, theta[k], xl, logw), None

    xL, _ = jax.lax.scan(layer, x, block)
    return _readout(spec, xL, w), xL


@dataclass(frozen=True)
class Network:
    """The jitted maps of one finite network (:func:`make_network`).

    Attributes:
        yhat: (θ (K, H, p), x (n, N, d), w (n, N)) → ŷ (n,).
        tokens: the same → the tokens at depth T, (n, N, d).
        risk_grad: (θ, x, w, y (n,)) → (R_H, ∇_θ R_H (K, H, p)).
        prepare: (x (n, N, d), w) → the network's input (the tokens, with the softmax means of a single layer of
            value heads appended: its attention does not change in training, so it is computed once).
        layers: L.
    """

    spec: NetworkSpec
    layers: int
    yhat: Callable[..., Any]
    tokens: Callable[..., Any]
    risk_grad: Callable[..., Any]
    prepare: Callable[..., Any]


def make_network(spec: NetworkSpec, layers: int) -> Network:
    """The finite network of ``spec`` with ``layers`` layers (ignored for the shallow model), jitted."""
    if spec.model == "depth-indexed" and layers % spec.blocks:
        raise ValueError(f"{layers} layers do not divide into {spec.blocks} blocks")

    def one(theta: jax.Array, x: jax.Array, w: jax.Array) -> tuple[jax.Array, jax.Array]:
        return _forward(spec, layers, theta, x, w)

    batched = jax.vmap(one, in_axes=(None, 0, 0))

    def yhat(theta: jax.Array, x: jax.Array, w: jax.Array) -> jax.Array:
        return batched(theta, x, w)[0]

    def tokens(theta: jax.Array, x: jax.Array, w: jax.Array) -> jax.Array:
        return batched(theta, x, w)[1]

    def risk(theta: jax.Array, x: jax.Array, w: jax.Array, y: jax.Array) -> jax.Array:
        return 0.5 * jnp.mean((yhat(theta, x, w) - y) ** 2)

    prepare = jax.jit(jax.vmap(lambda x, w: _prepare(spec, x, w)))
    return Network(spec, layers, jax.jit(yhat), jax.jit(tokens), jax.jit(jax.value_and_grad(risk)), prepare)
