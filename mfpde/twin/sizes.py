"""The sizes of ``mfpde twin``: the (H, N, L) of each sweep (heads, tokens, layers)."""

from __future__ import annotations

from dataclasses import dataclass

from mfpde.config import Config

__all__ = ["Size", "sweep_sizes"]


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


def sweep_sizes(cfg: Config) -> list[Size]:
    """The sizes of the three sweeps (heads, tokens, layers), each with the other two at their limit or largest."""
    tw = cfg.twin
    shallow = cfg.depth.model == "shallow"
    Lmax = 1 if shallow else max(tw.layers)
    out = [Size("heads", H, 0, Lmax) for H in tw.heads]
    out += [Size("tokens", max(tw.heads), N, Lmax) for N in tw.tokens]
    if not shallow:
        out += [Size("layers", max(tw.heads), 0, L) for L in tw.layers]
    return out
