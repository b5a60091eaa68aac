"""The sizes of ``mfpde twin``: the (H, N, L) of each sweep (heads, tokens, layers), the network and its training."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from mfpde import signals

if TYPE_CHECKING:
    from mfpde.twin.config import Section

__all__ = ["Size", "network_spec", "sweep_sizes", "train_size"]


@dataclass(frozen=True)
class Size:
    """One trained size: its sweep, H, N (0: the token limit), L."""

    sweep: str
    H: int
    N: int
    L: int

    @property
    def key(self) -> tuple[int, int, int]:
        """(H, N, L): the sizes a training is determined by (the sweeps share it)."""
        return (self.H, self.N, self.L)


def sweep_sizes(sec: Section) -> list[Size]:
    """The sizes of the three sweeps (heads, tokens, layers), each with the other two at their limit or largest."""
    tw = sec.twin
    shallow = sec.depth.model == "shallow"
    Lmax = 1 if shallow else max(tw.layers)
    out = [Size("heads", H, 0, Lmax) for H in tw.heads]
    out += [Size("tokens", max(tw.heads), N, Lmax) for N in tw.tokens]
    if not shallow:
        out += [Size("layers", max(tw.heads), 0, L) for L in tw.layers]
    return out


def network_spec(sec: Section) -> Any:
    """The :class:`~mfpde.twin.network.NetworkSpec` that mirrors the twin's section ``sec``."""
    from mfpde.twin.network import NetworkSpec

    lo = sec.loss
    return NetworkSpec(sec.depth.model, sec.heads.family, sec.heads.a, sec.depth.T,
                       sec.depth.layers if sec.depth.model == "depth-indexed" else 1, lo.readout,
                       tuple(lo.w) if lo.readout == "linear" else (), lo.b)


def train_size(sec: Section, size: Size, samples: tuple[list[Any], list[Any]], trace: list[int]) -> Any:
    """Train the seeds of one size (every rank may run any size: the numbers depend on the size only)."""
    import jax

    from mfpde.twin.network import make_network
    from mfpde.twin.tokens import draw_heads, input_tokens
    from mfpde.twin.train import Hyper, train_twin

    tw, tr, h = sec.twin, sec.training, sec.heads
    spec = network_spec(sec)
    net = make_network(spec, size.L)
    S = tw.seeds
    train, test = samples
    sampling = "limit" if size.N == 0 else tw.sampling
    data: dict[str, Any] = {"y": np.array([s.target for s in train]), "y_test": np.array([s.target for s in test])}
    for split, ss in (("", train), ("_test", test)):
        if not ss:
            data["x" + split], data["w" + split] = np.zeros((0, 1, sec.tokens.dim)), np.ones((0, 1))
            continue
        if sampling == "iid":  # each seed its own draws
            draws = [input_tokens(ss, size.N, "iid", np.random.default_rng([s, size.N, len(split)])) for s in range(S)]
            data["x" + split] = np.stack([x for x, _ in draws])
            data["w" + split] = np.stack([w for _, w in draws])
        else:
            data["x" + split], data["w" + split] = input_tokens(ss, size.N, sampling, np.random.default_rng(0))
    K = spec.blocks
    # heads and Brownian increments of a seed depend on (seed, H) only: the token and layer sweeps are paired
    theta0 = np.stack([draw_heads(h.init["mean"], h.init["cov"], np.asarray(h.box, float), (K, size.H),
                                  np.random.default_rng([s, size.H])) for s in range(S)])
    keys = jax.numpy.stack([jax.random.fold_in(jax.random.key(s), size.H) for s in range(S)])
    hyper = Hyper(tr.ds, tr.steps, sec.output.every, tr.lam if tr.regularization == "entropic" else 0.0, tr.lambda2,
                  tw.optimizer, tw.lr)
    return train_twin(net, hyper, theta0, data, keys, trace=trace,
                      stop=lambda: signals.pending() != 0)
