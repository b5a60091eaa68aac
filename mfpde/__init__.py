"""mfpde: finite elements for the mean-field transformer and its training.

Token transport (McKean–Vlasov continuity equation in depth), adjoint and first variation, and the
parameter Fokker–Planck equation (Wasserstein gradient flow in training time), coupled by splitting.

The public Python API (documented in the API reference) is what ``__all__`` lists; it is imported on first
use, so ``import mfpde`` stays cheap (numpy, MPI and DOLFINx load when a function is called)::

    import mfpde
    cfg = mfpde.load_config("demos/transport_small.toml")
    result = mfpde.transport(cfg)            # result.mu_T.values, result.mu_T.points: numpy arrays
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

__version__ = "0.1.0"

# A library logs through its own logger and prints nothing unless the application configures logging (the CLI
# does): without a handler Python's last resort would print warnings to stderr.
logging.getLogger("mfpde").addHandler(logging.NullHandler())

#: Public name -> the module that defines it.
_PUBLIC = {
    "Config": "mfpde.config",
    "ConfigError": "mfpde.errors",
    "ConfigErrors": "mfpde.errors",
    "NumericalError": "mfpde.errors",
    "load_config": "mfpde.api",
    "make_config": "mfpde.api",
    "build_problem": "mfpde.api",
    "transport": "mfpde.api",
    "train": "mfpde.api",
    "TokenField": "mfpde.api",
    "TransportResult": "mfpde.api",
    "TrainingResult": "mfpde.api",
    "read_vtx": "mfpde.io",
    "VTXField": "mfpde.io",
}

__all__ = ["Config", "ConfigError", "ConfigErrors", "NumericalError", "TokenField", "TrainingResult", "TransportResult",
           "VTXField", "__version__", "build_problem", "load_config", "make_config", "read_vtx", "train",
           "transport"]


def __getattr__(name: str) -> Any:
    """Import a public name on first use (PEP 562)."""
    if name in _PUBLIC:
        value = getattr(importlib.import_module(_PUBLIC[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'mfpde' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The public names and the module's own."""
    return sorted(set(globals()) | set(__all__))
