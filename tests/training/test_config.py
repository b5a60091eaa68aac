"""Training's and the twin's sections of the config: what the problem and the twin read, and nothing else."""

from __future__ import annotations

import dataclasses

from mpi4py import MPI

import pytest

from mfpde import config as C
from mfpde.tokens.box.config import section as box_section
from mfpde.tokens.box.problem import build
from mfpde.training.config import section as training_section
from mfpde.training.problem import CoupledProblem
from mfpde.twin.config import section as twin_section


def test_the_sections_are_the_configs_sections_and_nest():
    cfg = C.load(None, ["petsc.token={ksp_type='cg'}", "petsc.param={ksp_rtol=1e-9}"])
    box, tr, tw = box_section(cfg), training_section(cfg), twin_section(cfg)
    for name in ("tokens", "depth", "heads", "data", "loss", "output"):
        assert getattr(box, name) is getattr(cfg, name) is getattr(tr, name) is getattr(tw, name)
    assert box.token_options == tr.token_options == {"ksp_type": "cg"}
    assert tr.param_options == tw.param_options == {"ksp_rtol": 1e-9}
    assert tr.training is tw.training is cfg.training and tw.twin is cfg.twin
    assert not hasattr(box, "training") and not hasattr(tr, "twin") and not hasattr(tw, "continuation")
    with pytest.raises(dataclasses.FrozenInstanceError):
        box.depth = cfg.depth  # type: ignore[misc]


def test_a_whole_config_is_refused_by_name():
    cfg = C.load(None, [])
    with pytest.raises(TypeError, match=r"CoupledProblem.from_config\(cfg\)"):
        CoupledProblem(cfg, MPI.COMM_SELF)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"mfpde.tokens.box.config.section\(cfg\)"):
        build(cfg, MPI.COMM_SELF)  # type: ignore[arg-type]
