"""The sphere's config rules: each bad key one line naming it (exit 2), the box keys refused, the data checked."""

from __future__ import annotations

import pytest

import mfpde.config as C

DEMO = "demos/sphere.toml"


def test_demo_loads():
    cfg = C.load(DEMO)
    assert cfg.tokens.domain == "sphere" and cfg.heads.init["points"] == [[9.0, 1.0]]


@pytest.mark.parametrize("override,key", [
    ("tokens.refine=-1", "tokens.refine"), ("tokens.refine=13", "tokens.refine"),
    ("tokens.degree=4", "tokens.degree"), ("tokens.attention=\"sigmoid\"", "tokens.attention"),
    ("tokens.solver=\"spectral\"", "tokens.solver"), ("data.kind=\"circle_modes\"", "data.kind"),
    ("data.modes=[[0, 0, 0.01]]", "data.modes[0]"), ("data.modes=[[2, 3, 0.01]]", "data.modes[0]"),
    ("data.modes=[[65, 0, 0.01]]", "data.modes[0]"), ("data.modes=[[1.5, 0, 0.01]]", "data.modes[0]"),
    ("data.modes=[[1, 0]]", "data.modes"), ("heads.family=\"value\"", "heads.family"),
    ("depth.model=\"depth-indexed\"", "depth.model"), ("tokens.beta=-1.0", "tokens.beta"),
    ("tokens.box=[[0.0, 1.0]]", "tokens.box"), ("tokens.cells=[10]", "tokens.cells"),
    ("tokens.dim=2", "tokens.dim"), ("tokens.cell=\"triangle\"", "tokens.cell"),
])
def test_bad_sphere_key_is_named(override, key):
    with pytest.raises(C.ConfigError, match=key.replace("[", r"\[").replace("]", r"\]")) as e:
        C.load(DEMO, [override])
    assert "\n" not in str(e.value)


def test_negative_initial_density_is_refused():
    """μ_0 = 1/4π + a Y_10 is negative at a pole once |a| √(3/4π) > 1/4π, i.e. |a| > 1/√(12π) ≈ 0.1629."""
    edge = 1 / (12 * 3.141592653589793) ** 0.5
    C.load(DEMO, [f"data.modes=[[1, 0, {0.999 * edge}]]"])
    with pytest.raises(C.ConfigError, match="data.modes: μ_0") as e:
        C.load(DEMO, [f"data.modes=[[1, 0, {1.001 * edge}]]"])
    assert "negative" in str(e.value)


def test_sphere_data_on_a_box_names_the_domain():
    with pytest.raises(C.ConfigError, match="'sphere'"):
        C.load("demos/transport_small.toml", ["data.kind=\"sphere_noise\""])


def test_refine_on_a_box_does_not_apply():
    with pytest.raises(C.ConfigError, match="tokens.refine: does not apply"):
        C.load("demos/transport_small.toml", ["tokens.refine=3"])


def test_memory_bound_names_refine(monkeypatch):
    import mfpde.limits

    monkeypatch.setattr(mfpde.limits, "node_memory_bytes", lambda: 1e9)
    with pytest.raises(C.ConfigError, match="tokens.refine: 10 .* GB"):
        C.load(DEMO, ["tokens.refine=10"])


def test_api_transport_on_the_sphere_names_the_domain():
    """mfpde.transport(cfg) on the sphere: a ConfigError naming tokens.domain (it fell to the box's set-up, which
    said "data.path '.': cannot be read")."""
    import mfpde
    from mfpde import config
    from mfpde.errors import ConfigError

    cfg = config.load("demos/sphere.toml", ["tokens.refine=1", "depth.T=1", "depth.steps=2"])
    with pytest.raises(ConfigError, match=r"^tokens\.domain: 'sphere'"):
        mfpde.transport(cfg)


def test_softmax_beta_is_capped_where_the_tilted_kernel_stays_affordable():
    """β = 1000 (SA) was accepted and then ran for ever (the tilted kernel's 73600 centres: 6 GB of work arrays and
    minutes per velocity update): refused at the door, naming tokens.beta."""
    from mfpde.tokens.sphere.config import MAX_BETA
    from mfpde.tokens.sphere.tilted import fibonacci_centres, tilt_radius

    beta = MAX_BETA["softmax"]
    C.load(DEMO, [f"tokens.beta={beta}"])
    assert len(fibonacci_centres(tilt_radius(1e-6) / beta)) * 5 * 2048 * 8 < 0.5e9  # work arrays at the cap
    with pytest.raises(C.ConfigError, match=r"^tokens\.beta: .*softmax") as e:
        C.load(DEMO, ["tokens.beta=1000.0"])
    assert "\n" not in str(e.value)


def test_a_refused_beta_is_not_checked_further():
    """tokens.beta = -1 also drew "heads.init: the sphere takes Dirac heads" (the head it would have made)."""
    with pytest.raises(C.ConfigError) as e:
        C.load(DEMO, ["tokens.beta=-1.0"])
    assert str(e.value) == "tokens.beta: must be >= 0, got -1"
