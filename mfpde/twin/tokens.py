"""Finite inputs of the twin: N tokens of each input measure μ_0^i, and H heads drawn from ρ_0 (numpy).

* ``iid``: N independent draws from μ_0^i, weights 1/N (theory §1.3: the empirical measure μ^N);
* ``quantile``: N stratified draws, weights 1/N: u_k = (k + ½)/N pushed through the inverse CDF (1-D Gaussians:
  the normal quantiles; images: the pixel whose cumulative mass holds u_k in raster order, the position in the
  pixel from what is left of u_k and a golden-ratio sequence across it);
* ``limit``: a weighted quadrature of μ_0^i exact to round-off for the model's smooth integrands (images: a q×q
  Gauss–Legendre rule on each pixel of positive mass; Gaussians: a tensor Gauss–Hermite rule; point clouds:
  the points and their weights): the N → ∞ limit itself, for sweeps in H or L where the token error must vanish.

Heads: H independent draws from ρ_0 = the Gaussian of ``heads.init`` restricted to the Θ box (the PDE's ρ_0
is that restriction, renormalised), by rejection.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
from scipy.special import ndtri

__all__ = ["SAMPLINGS", "draw_heads", "input_tokens"]

Array = npt.NDArray[np.float64]
SAMPLINGS = ("iid", "quantile", "limit")
#: Gauss–Legendre points per pixel side and Gauss–Hermite points per axis of the ``limit`` quadrature.
LIMIT_ORDER = 2
GOLDEN = 0.6180339887498949


def _pixels(sample: Any) -> tuple[Array, Array]:
    """Lower-left corners (P, 2) and masses (P,) of an image's pixels of positive mass (raster order)."""
    img = np.asarray(sample.params["image"], float)
    x0, y0 = sample.params.get("origin", (0.0, 0.0))
    i, j = np.nonzero(img > 0)
    corners = np.stack([x0 + j / 8.0, y0 + 1.0 - (i + 1) / 8.0], axis=1)
    mass = img[i, j]
    return corners, mass / mass.sum()


def _image_tokens(sample: Any, n: int, sampling: str, rng: np.random.Generator) -> tuple[Array, Array]:
    corners, mass = _pixels(sample)
    if sampling == "limit":
        g, gw = np.polynomial.legendre.leggauss(LIMIT_ORDER)
        g, gw = (g + 1) / 16.0, gw / 2.0  # on [0, 1/8], weights summing to 1 on each axis
        off = np.stack(np.meshgrid(g, g, indexing="ij"), -1).reshape(-1, 2)
        ow = np.outer(gw, gw).ravel()
        pts = (corners[:, None, :] + off[None]).reshape(-1, 2)
        return pts, (mass[:, None] * ow[None]).ravel()
    cdf = np.cumsum(mass)
    cdf[-1] = 1.0
    if sampling == "iid":
        u = rng.random(n)
        frac = rng.random((n, 2))
        pix = np.searchsorted(cdf, u, side="right")
    else:
        u = (np.arange(n) + 0.5) / n
        pix = np.minimum(np.searchsorted(cdf, u, side="right"), len(mass) - 1)
        left = np.where(pix > 0, cdf[pix - 1], 0.0)
        frac = np.stack([(u - left) / mass[pix], (np.arange(n) * GOLDEN) % 1.0], axis=1)
    return corners[pix] + np.clip(frac, 0.0, 1.0) / 8.0, np.full(n, 1.0 / n)


def _gaussian_tokens(sample: Any, n: int, sampling: str, rng: np.random.Generator) -> tuple[Array, Array]:
    m, c = np.asarray(sample.params["mean"], float), np.asarray(sample.params["cov"], float)
    d = len(m)
    chol = np.linalg.cholesky(c)
    if sampling == "limit":
        z, zw = np.polynomial.hermite_e.hermegauss(24 if d == 1 else 12)
        zw = zw / zw.sum()
        zz = np.stack(np.meshgrid(*([z] * d), indexing="ij"), -1).reshape(-1, d)
        ww = np.prod(np.stack(np.meshgrid(*([zw] * d), indexing="ij"), -1).reshape(-1, d), axis=1)
        return m + zz @ chol.T, ww
    if sampling == "iid":
        z = rng.standard_normal((n, d))
    elif d == 1:
        z = ndtri((np.arange(n) + 0.5) / n)[:, None]
    else:  # a stratified first axis, a golden-ratio sequence of quantiles on the others
        z = np.stack([ndtri((np.arange(n) + 0.5) / n)] + [ndtri((np.arange(n) * GOLDEN * (k + 1) + 0.5 / n) % 1.0)
                                                          for k in range(d - 1)], axis=1)
    return m + z @ chol.T, np.full(n, 1.0 / n)


def input_tokens(samples: list[Any], n: int, sampling: str, rng: np.random.Generator) -> tuple[Array, Array]:
    """Tokens (len(samples), N', d) and weights (len(samples), N') of each sample's μ_0 (N' = n unless ``limit``).

    A ``limit`` rule of unequal length per sample is padded with zero-weight copies of the sample's first point
    (a zero weight adds nothing to any sum of the network; its log-weight −inf drops out of the softmax).

    Raises:
        ValueError: a sampling this module does not know, or a data kind it cannot draw from.
    """
    if sampling not in SAMPLINGS:
        raise ValueError(f"unknown token sampling {sampling!r}")
    out = []
    for s in samples:
        if s.kind == "image":
            out.append(_image_tokens(s, n, sampling, rng))
        elif s.kind == "gaussian":
            out.append(_gaussian_tokens(s, n, sampling, rng))
        elif s.kind == "points" and sampling == "limit":
            w = np.asarray(s.params["weights"], float)
            out.append((np.asarray(s.params["points"], float), w / w.sum()))
        elif s.kind == "points":
            w = np.asarray(s.params["weights"], float)
            pts = np.asarray(s.params["points"], float)
            out.append((pts[rng.choice(len(w), size=n, p=w / w.sum())], np.full(n, 1.0 / n)))
        else:
            raise ValueError(f"the twin cannot draw tokens from a {s.kind!r} sample")
    width = max(len(w) for _, w in out)
    X = np.empty((len(out), width, out[0][0].shape[1]))
    W = np.zeros((len(out), width))
    for k, (x, w) in enumerate(out):
        X[k, : len(w)], X[k, len(w):] = x, x[0]
        W[k, : len(w)] = w
    return X, W


def draw_heads(mean: Array, cov: Array, box: Array, shape: tuple[int, ...], rng: np.random.Generator) -> Array:
    """Draws of N(mean, cov) restricted to ``box`` ((p, 2) bounds), shape ``shape + (p,)``, by rejection."""
    mean, box = np.asarray(mean, float), np.asarray(box, float)
    chol = np.linalg.cholesky(np.asarray(cov, float))
    n, p = int(np.prod(shape)), len(mean)
    out = np.empty((0, p))
    while len(out) < n:
        z = mean + rng.standard_normal((2 * (n - len(out)) + 8, p)) @ chol.T
        inside = np.all((z >= box[:, 0]) & (z <= box[:, 1]), axis=1)
        out = np.concatenate([out, z[inside]])
    return out[:n].reshape(*shape, p)
