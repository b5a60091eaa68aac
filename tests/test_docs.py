"""The documentation: every config key documented with its default, no development history in user docs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mfpde.config_keys import _toml_value, schema_keys

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
#: The user docs: the README and every page of docs/ written by hand.
USER_DOCS = [ROOT / "README.md", *sorted(p for p in DOCS.glob("*.md"))]


def _documented() -> dict[str, str]:
    rows = re.findall(r"^\| `([a-z_]+\.[A-Za-z_0-9]+)` \| `(.*?)` \|", (DOCS / "config.md").read_text(), re.M)
    return dict(rows)


def test_every_config_key_is_documented_with_its_default_and_no_other():
    doc, schema = _documented(), schema_keys()
    assert set(doc) == set(schema), (set(schema) - set(doc), set(doc) - set(schema))
    for key, default in schema.items():
        assert doc[key] == _toml_value(default), f"{key}: docs say {doc[key]}, the schema {_toml_value(default)}"


def test_config_reference_lists_the_embedded_defaults_values():
    """The `mfpde run` column: each key's value in the embedded default (mfpde/defaults/run.toml resolved), or —
    where that problem does not use the key."""
    import dataclasses

    from mfpde.config import _ALIASES_BACK, load
    from mfpde.config_keys import in_use

    rows = dict(re.findall(r"^\| `([a-z_]+\.[A-Za-z_0-9]+)` \| `.*?` \| (`.*?`|—) \|", (DOCS / "config.md").read_text(),
                           re.M))
    cfg = load(None)
    want = {}
    for f in (f for f in dataclasses.fields(cfg) if f.name != "source"):
        for g in dataclasses.fields(sec := getattr(cfg, f.name)):
            key = f"{f.name}.{_ALIASES_BACK.get((f.name, g.name), g.name)}"
            want[key] = f"`{_toml_value(getattr(sec, g.name))}`".replace("|", "\\|") if in_use(cfg, key) else "—"
    assert set(rows) == set(want), set(rows) ^ set(want)
    wrong = {k: (rows[k], want[k]) for k in want if rows[k] != want[k]}
    assert not wrong, f"docs/config.md's `mfpde run` column against mfpde/defaults/run.toml: {wrong}"


@pytest.mark.parametrize("page", USER_DOCS, ids=lambda p: p.name)
def test_user_docs_carry_no_development_history(page):
    """Issue numbers, commit hashes and 'this session' narrative belong in CHANGELOG.md."""
    text = page.read_text()
    assert not re.search(r"\bissues? #?\d+|\bPR #\d+|(this|previous|last) session", text, re.I), page
    hashes = [h for h in re.findall(r"\b[0-9a-f]{7,40}\b", text) if re.search(r"[a-f]", h) and re.search(r"\d", h)]
    assert not hashes, (page, hashes)
    assert "../shared" not in text and "shared/" not in text, page


def test_readme_is_short_and_keeps_the_commands_ci_relies_on():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    for cmd in ("make run", "make test", "make test-coretypes", "mfpde transport demos/transport_small.toml",
                "mpiexec -n", "docker build -t mfpde ."):
        assert cmd in text, cmd
    make = (ROOT / "Makefile").read_text()
    for target in ("run:", "test:", "test-coretypes:", "docs:", "env:"):
        assert f"\n{target}" in make, target
    for link in re.findall(r"\]\(([\w./-]+\.(?:md|png|cff)|LICENSE)\)", text):  # every link of the README exists
        assert (ROOT / link).exists(), link


def test_verification_page_has_every_registered_check():
    import sys

    sys.path.insert(0, str(DOCS / "_ext"))
    import mfpde_docs

    from mfpde.verify.registry import CHECKS

    page = mfpde_docs.verify_page()
    rows = [line for line in page.splitlines() if line.startswith("| `")]
    assert [re.match(r"\| `(\w+)`", r).group(1) for r in rows] == list(CHECKS)  # type: ignore[union-attr]
    for name, check in CHECKS.items():
        (row,) = [r for r in rows if r.startswith(f"| `{name}`")]
        assert " ".join(check.reference.split()) in row.replace("\\|", "|"), name


def test_demo_pages_keep_text_and_code():
    import sys

    sys.path.insert(0, str(DOCS / "_ext"))
    import mfpde_docs

    demo = ROOT / "demos" / "demo_gaussian_transport.py"
    page = mfpde_docs.demo_page(demo)
    assert page.startswith("# Gaussian tokens through attention")
    code = "\n".join(re.findall(r"```python\n(.*?)```", page, re.S))
    for line in demo.read_text().splitlines():  # every line of code is in a code block, every comment in the text
        if line.strip() and not line.startswith("#"):
            assert line in code, line
    stored = (DOCS / "_static" / "demos" / "gaussian_transport.txt").read_text().strip()
    assert "## Output (quick mode)" in page and stored in page  # the quick run's output, stored
    assert "(../_static/demos/gaussian_transport.png)" in page
    for d in sorted((ROOT / "demos").glob("demo_*.py")):  # every demo has its stored output
        assert (DOCS / "_static" / "demos" / f"{d.stem.removeprefix('demo_')}.txt").is_file(), d.name


def test_licence_and_citation_match_the_package():
    import tomllib

    import yaml

    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert meta["license"] == "MIT" and (ROOT / "LICENSE").read_text().startswith("MIT License")
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    import mfpde

    assert cff["cff-version"] == "1.2.0" and cff["license"] == "MIT" and cff["version"] == mfpde.__version__
    assert cff["title"] and cff["authors"]
    log = (ROOT / "CHANGELOG.md").read_text()
    assert log.startswith("# Changelog") and "## [Unreleased]" in log and "Keep a Changelog" in log


def test_nothing_in_the_repository_points_outside_it():
    import subprocess

    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    me = Path(__file__).relative_to(ROOT).as_posix()
    for f in files:
        path = ROOT / f
        if f == me or not path.is_file() or path.suffix in (".png", ".msh", ".npz"):
            continue
        text = path.read_text(errors="replace")
        assert "../shared" not in text and "shared/" not in text, f


@pytest.mark.parametrize("page", ["README.md", "docs/api.md"])
def test_the_python_examples_run(page, tempdir, monkeypatch):
    """The README's and the API page's Python blocks, run as a user would (in a fresh directory with demos/)."""
    from mpi4py import MPI

    blocks = re.findall(r"```python\n(.*?)```", (ROOT / page).read_text(), re.S)
    assert blocks
    if MPI.COMM_WORLD.rank == 0:
        (tempdir / "demos").symlink_to(ROOT / "demos")
    MPI.COMM_WORLD.Barrier()
    monkeypatch.chdir(tempdir)
    for code in blocks:
        scope: dict[str, object] = {}
        exec(compile(code, page, "exec"), scope)  # noqa: S102
        values = scope.get("res")
        if values is not None:  # μ_T as arrays
            assert values.mu_T.values.ndim == 1 and values.mu_T.points.shape[0] == values.mu_T.values.shape[0]
        if "run" in scope:
            assert scope["run"].status == "ok" and scope["run"].rho.ndim == 2


@pytest.mark.serial
def test_the_default_runs_numbers_in_the_docs_are_regenerated(tempdir):
    """`mfpde run` (the embedded default, as docs/digits.md, the user guide's demo_digits row and the README state
    it, each naming that command): accuracies, risk, the fitted and the theorem's rate, the boundary mass, to the
    digits printed. The full run (300 steps, about a CPU minute)."""
    import csv
    import json

    from mfpde.cli import main

    out = tempdir / "default"
    quiet = ["--quiet", "--set", "output.fields=false", "--set", "output.plots=false"]
    assert main(["run", "--out", str(out), *quiet]) == 0
    rep = json.loads((out / "report.json").read_text())
    rows = list(csv.DictReader((out / "history.csv").open()))
    first, last = rows[0], rows[-1]
    acc = {"test0": f"{float(first['test_accuracy']):.3f}", "test": f"{float(last['test_accuracy']):.3f}",
           "train0": f"{float(first['train_accuracy']):.3f}", "train": f"{float(last['train_accuracy']):.3f}",
           "risk0": f"{float(first['risk']):.3f}", "risk": f"{float(last['risk']):.3f}"}
    digits = " ".join((DOCS / "digits.md").read_text().split())
    for want in (f"held-out accuracy {acc['test0']} → {acc['test']}", f"train {acc['train0']} → {acc['train']}",
                 f"risk {acc['risk0']} → {acc['risk']}", f"fitted rate {rep['rate']['fitted']:.3f} against 2λ₂ = "
                 f"{rep['rate']['theory']:g}", f"least training risk ({acc['risk']};"):
        assert want in digits, f"docs/digits.md: {want!r}"
    assert rep["final"]["theta_boundary_mass"] < 1e-17  # the page: 3·10⁻¹⁹, round-off of a Gaussian far inside
    guide = (DOCS / "user-guide.md").read_text()
    (row,) = [r for r in guide.splitlines() if r.startswith("| `demo_digits.py`")]
    assert (f"risk {acc['risk0']} → {acc['risk']}; accuracy of ρ₀ train {acc['train0']} / held-out {acc['test0']}, "
            f"of the trained ρ {acc['train']} / {acc['test']}") in row, row
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert f"from {acc['test0']} to {acc['test']}** (risk {acc['risk0']} → {acc['risk']})" in readme


def test_the_deep_ntk_row_is_its_stored_full_output():
    """The user guide's demo_deep_ntk row states the full run's numbers; they are those of its stored output
    (``python demos/demo_deep_ntk.py > docs/_static/demos/deep_ntk.full.txt``, about 2 minutes: rerun it when
    tests/test_demos.py finds the quick output moved)."""
    full = (DOCS / "_static" / "demos" / "deep_ntk.full.txt").read_text()
    (row,) = [r for r in (DOCS / "user-guide.md").read_text().splitlines() if r.startswith("| `demo_deep_ntk.py`")]
    rate = re.search(r"fitted rate ([\d.]+) on \d+ rows, closed form c_Δs = ([\d.]+)", full)
    assert rate and f"fitted rate {float(rate[1]):.3f} against c_Δs = {float(rate[2]):.3f}" in row
    value = re.search(r"value heads: R ([\d.e+-]+) → ([\d.e+-]+); least-squares floor R_LS = ([\d.e+-]+); "
                      r"NTK eigenvalues \[([\d.]+), ([\d.]+)\]", full)
    assert value, full
    r0, r1, floor, e0, e1 = (float(x) for x in value.groups())
    assert (f"R {r0:.4f} → {r1:.4f}, at the floor R_LS = {floor:.4f}" in row
            and f"NTK eigenvalues {e0:g} and {e1:.1f}" in row), row
    av = re.search(r"\(a, v\) heads: R [\d.e+-]+ → ([\d.e+-]+) = ([\d.]+) R_LS; NTK eigenvalues \[([\d.]+), ([\d.]+)\]",
                   full)
    assert av, full
    assert (f"R → {float(av[1]):.1e} = {av[2]} R_LS, NTK eigenvalues {float(av[3]):.3f} and {float(av[4]):.2f}"
            .replace("e-05", "e-5") in row), row
    err = re.search(r"\|R_h − G\| ≤ ([\d.e+-]+)", full)
    assert err and f"within the token error {float(err[1]):.1e}".replace("e-04", "e-4") in row


def test_the_circle_pages_flow_map_w1_is_regenerated(tempdir):
    """docs/circle.md: W1 between the flow map's `cdf_T` at M = 128, 512 and 2048 labels on the demo at t = 1.5,
    from the command the page names (three runs, under a CPU second)."""
    import json

    import numpy as np

    from mfpde.cli import main
    from mfpde.tokens.circle.diag import w1_circle

    cdf = {}
    for m in (128, 512, 2048):
        out = tempdir / f"m{m}"
        assert main(["transport", str(ROOT / "demos" / "circle.toml"), "--out", str(out), "--quiet", "--set",
                     "tokens.solver='flow'", "--set", f"tokens.labels={m}"]) == 0
        cdf[m] = np.array(json.loads((out / "report.json").read_text())["samples"][0]["cdf_T"])
    a, b = w1_circle(cdf[128], cdf[2048]), w1_circle(cdf[512], cdf[2048])
    text = " ".join((DOCS / "circle.md").read_text().split())
    assert f"M = 128 and M = 2048 is {a:.3f}, between M = 512 and 2048 {b:.2g}" in text, (a, b)


def _sci(x: float) -> str:
    """x as the docs print it: 2·10⁻⁸."""
    mant, exp = f"{x:.0e}".split("e")
    sup = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")
    return f"{mant}·10{str(int(exp)).translate(sup)}"


@pytest.mark.serial
def test_the_deep_gibbs_branch_of_the_continuation_page_is_regenerated(tempdir):
    """docs/continuation.md, the deep model: `mfpde continuation demos/gibbs_deep.toml` (about 30 CPU s): the
    points, Newton iterations and passes, the certificate and residual bounds, the leading eigenvalue, risk, mean
    and variance at the ends of the branch, to the digits printed (the CPU time is not compared)."""
    import json

    from mfpde.cli import main

    out = tempdir / "gibbs_deep"
    assert main(["continuation", str(ROOT / "demos" / "gibbs_deep.toml"), "--out", str(out), "--quiet"]) == 0
    rep = json.loads((out / "report.json").read_text())
    (b,) = rep["branches"]
    assert not rep["bifurcations"] and all(b["stable"])
    assert max(abs(c) for c in b["certificate"]) < 1e-16 and max(b["residual"]) < 1e-12
    lam, lead, risk, var = b["parameter"], b["leading_eigenvalue"], b["risk"], b["variance"]
    mean = [m[0] for m in b["mean"]]
    text = " ".join((DOCS / "continuation.md").read_text().split())
    para = text.split("**Deep model.**")[1].split("A more nonlinear case")[0].replace("−", "-")
    for want in (f"{len(lam)} points, {rep['newton_iterations']} Newton iterations, {rep['token_solves']} forward "
                 "+ adjoint passes", f"from {lead[0]:.4f} (λ = {lam[0]:g}) to -1 + {_sci(1 + lead[-1])} (λ = "
                 f"{lam[-1]:g})", f"the risk from {risk[0]:.4f} to {risk[-1]:.4f}", f"stays at (0, {mean[0][1]:.3f})",
                 f"then its v moves to {mean[-1][1]:.3f}", f"falls from {var[0][0]:.2f} to {var[-1][0]:.2g}"):
        assert want.replace("−", "-") in para, want


def test_the_nonlinear_deep_gibbs_branch_is_its_stored_report():
    """docs/continuation.md, the more nonlinear deep case: its numbers against the stored report of the command
    the page gives (``mfpde continuation demos/gibbs_deep.toml --set ...``, about 150 CPU s, its report.json
    copied to docs/_static/gibbs_deep_nonlinear.json); the regenerated deep branch above moves with it."""
    import json

    rep = json.loads((DOCS / "_static" / "gibbs_deep_nonlinear.json").read_text())
    (b,) = rep["branches"]
    assert not rep["bifurcations"] and all(b["stable"])
    text = " ".join((DOCS / "continuation.md").read_text().split()).replace("−", "-")
    para = text.split("A more nonlinear case")[1].split("**Bad input**")[0]
    lam, risk, lead = b["parameter"], b["risk"], b["leading_eigenvalue"]
    m0, m1 = (b["mean"][i][0] for i in (0, -1))
    for want in (f"from λ = {lam[0]:g} to {lam[-1]:g} ({len(lam)} points, {rep['token_solves']} passes",
                 f"risk from {risk[0]:.3f} to {risk[-1]:.4f}", f"mean of θ from ({m0[0]:.2f}, {m0[1]:.2f}) to "
                 f"({m1[0]:.2f}, {m1[1]:.2f})", f"leading eigenvalue is {min(lead):.2f} to {max(lead):.2f}"):
        assert want in para, want
    for override in ("data.mean=[[0.5]]", "data.cov=[[[0.25]]]", "data.target=[2.0]", "training.lambda2=0.1",
                     "continuation.start=0.5"):
        assert f"--set {override}" in para


def test_the_circles_fastest_modes_in_theory_are_the_closed_form():
    """theory §9.1: k_max(β) and the runner-up ratios, from γ_k = k² I_k(β)/β (scipy)."""
    import numpy as np
    import scipy.special

    text = " ".join((DOCS / "theory.md").read_text().split())

    def ranked(beta: float) -> tuple[int, float]:
        k = np.arange(1, 60)
        g = k**2 * scipy.special.ive(k, beta)
        top = np.argsort(g)[::-1]
        return int(k[top[0]]), float(g[top[1]] / g[top[0]])

    listed = re.search(r"The fastest mode k_max\(β\) \((.*?)\)", text)
    assert listed, "theory §9.1's list of k_max"
    pairs = re.findall(r"β = (\d+): (\d+)", listed[1])
    assert len(pairs) >= 5
    for beta, k in pairs:
        assert ranked(float(beta))[0] == int(k), beta
    close = re.search(r"within a few per cent of γ_\{k_max\} \(β = ([\d, ]+): ([\d.]+)–([\d.]+)\)", text)
    assert close, "theory §9.1's runner-up ratios"
    ratios = [round(ranked(float(b))[1], 2) for b in close[1].split(", ")]
    assert min(ratios) == float(close[2]) and max(ratios) == float(close[3]), ratios


@pytest.mark.serial
def test_the_user_guides_config_rows_are_regenerated(tempdir):
    """The user guide's table of example configs: `mfpde run demos/<name>.toml` for the three that take seconds
    (shallow, value_heads, gaussian_2d): the risk, free energy, rates and ρ_S the rows state; `mfpde transport` of
    the noisy circle and sphere: their sub-steps (timings are not compared)."""
    import csv
    import json

    from mfpde.cli import main

    guide = (DOCS / "user-guide.md").read_text()
    rows = {m[0]: m[1] for m in re.findall(r"^\| `(\w+)\.toml` \| .* \| (.*?) \|$", guide, re.M)}
    got = {}
    for name in ("shallow", "value_heads", "gaussian_2d"):
        out = tempdir / name
        assert main(["run", str(ROOT / "demos" / f"{name}.toml"), "--out", str(out), "--quiet",
                     "--set", "output.plots=false"]) == 0
        got[name] = (json.loads((out / "report.json").read_text()), list(csv.DictReader((out / "history.csv").open())))
    rep, _ = got["shallow"]
    assert f"rate: fitted {rep['rate']['fitted']:.2f}, theory {rep['rate']['theory']:.1f}" in rows["shallow"]
    rep, h = got["value_heads"]
    mean, cov = rep["final"]["rho_mean"][0], rep["final"]["rho_cov"][0][0]
    assert (f"risk {float(h[0]['risk']):.3f} → {float(h[-1]['risk']):.4f}, ρ_S = N({mean:.3f}, {cov:.3f})"
            in rows["value_heads"]), rows["value_heads"]
    _, h = got["gaussian_2d"]
    assert (f"risk {float(h[0]['risk']):.3f} → {float(h[-1]['risk']):.3f}, F {float(h[0]['free_energy']):.3f} → "
            f"{float(h[-1]['free_energy']):.3f}") in rows["gaussian_2d"], rows["gaussian_2d"]
    for name, shown in (("noisy_circle", lambda n: f"{round(n, -3):,}".replace(",", " ")), ("noisy_sphere", str)):
        out = tempdir / name  # `mfpde transport` with noise: the sub-steps the row states (12 000, 780)
        assert main(["transport", str(ROOT / "demos" / f"{name}.toml"), "--out", str(out), "--quiet"]) == 0
        steps = json.loads((out / "report.json").read_text())["samples"][0]["substeps"]
        assert f"({shown(steps)} sub-steps)" in rows[name], (name, steps, rows[name])


#: a number as a page prints it: 0.609014, 8.0e-5, 5e-13 (integers, which name sizes and counts, are left out)
_DECIMAL = re.compile(r"(?<![\w.])[-−]?\d+(?:\.\d+(?:e[-+]?\d+)?|e[-+]?\d+)")


def _rounds_to(shown: str, value: float) -> bool:
    """``value`` rounded to the digits of ``shown`` is ``shown``."""
    mant, _, exp = shown.replace("−", "-").partition("e")
    decimals = len(mant.split(".")[1]) if "." in mant else 0
    unit = 10.0 ** ((int(exp) if exp else 0) - decimals)
    return abs(float(shown.replace("−", "-")) - value) <= 0.5 * unit * (1 + 1e-9)


@pytest.mark.parametrize("stored", sorted((DOCS / "_static" / "demos").glob("*.full.txt")), ids=lambda p: p.name)
def test_the_demo_table_rows_are_their_stored_full_outputs(stored):
    """The user guide's demo table states full runs: each decimal number of a row's last column (not timings, not
    round-off below 1e-9) is a number of the stored output of ``python demos/demo_<name>.py`` rounded to the
    digits shown. The stored outputs are rerun by hand (minutes); the quick outputs of tests/test_demos.py move
    with them."""
    name = stored.name.removesuffix(".full.txt")
    (row,) = [r for r in (DOCS / "user-guide.md").read_text().splitlines() if r.startswith(f"| `demo_{name}.py`")]
    cell = row.rstrip(" |").rsplit(" | ", 1)[1]
    printed = [float(m.group().replace("−", "-")) for m in _DECIMAL.finditer(stored.read_text())]
    printed += [float(x) for x in re.findall(r"(?<![\w.])\d+(?![\w.])", stored.read_text())]
    missing = []
    for m in _DECIMAL.finditer(cell):
        if re.match(r"\s?s\b", cell[m.end():]) or abs(float(m.group().replace("−", "-"))) < 1e-9:
            continue
        if not any(_rounds_to(m.group(), y) for y in printed):
            missing.append(m.group())
    assert not missing, f"demo_{name}: {missing} not in {stored.name}"


def test_the_single_layer_gibbs_branch_of_the_continuation_page_is_regenerated(tempdir):
    """docs/continuation.md, the single layer: `mfpde continuation demos/gibbs_branch.toml` (seconds): the variance
    λ/λ₂ for λ ≤ 0.1, ā to round-off against the closed form the page quotes, the variance at λ = 1."""
    import json

    from mfpde.cli import main
    from mfpde.config import load

    out = tempdir / "gibbs_branch"
    demo = str(ROOT / "demos" / "gibbs_branch.toml")
    assert main(["continuation", demo, "--out", str(out), "--quiet"]) == 0
    (b,) = json.loads((out / "report.json").read_text())["branches"]
    cfg = load(demo)
    lam2, m0, var0, y, a = (cfg.training.lambda2, cfg.data.mean[0][0], cfg.data.cov[0][0][0], cfg.data.target[0],
                            cfg.heads.a)
    k = m0 * (1 + a * var0)  # theory §6.2: ā* = k(y − m₀)/(λ₂ + k²)
    text = " ".join((DOCS / "continuation.md").read_text().split())
    m = re.search(r"equals λ/λ₂ to (\S+) for λ ≤ ([\d.]+) and ā = ([\d.]+) \(closed form ([\d.]+)\);", text)
    assert m, "the single-layer paragraph"
    tol, upto, abar, closed = float(m[1]), float(m[2]), float(m[3]), float(m[4])
    small = [(lam, v[0]) for lam, v in zip(b["parameter"], b["variance"], strict=True) if lam <= upto]
    assert small and all(abs(v - lam / lam2) <= tol * lam / lam2 for lam, v in small), small
    assert abs(b["order_parameter"][-1] - abar) <= 2e-16 and closed == k * (y - m0) / (lam2 + k * k)
    (at1,) = [v[0] for lam, v in zip(b["parameter"], b["variance"], strict=True) if lam == 1.0]
    assert f"variance {at1:.3f} at λ = 1" in text.replace("\n", " ")
