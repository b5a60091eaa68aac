"""The documentation: every config key documented with its default, no development history in user docs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mfpde.config.keys import _toml_value, schema_keys

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
    """The `mfpde run` column: each key's value in the embedded default (mfpde/config/defaults/run.toml resolved), or —
    where that problem does not use the key."""
    import dataclasses

    from mfpde.config import _ALIASES_BACK, load
    from mfpde.config.keys import in_use

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
    assert not wrong, f"docs/config.md's `mfpde run` column against mfpde/config/defaults/run.toml: {wrong}"


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
    from the command the page names, and its three collapsed clusters (three runs, under a CPU second)."""
    import json

    import numpy as np

    from mfpde.cli import main
    from mfpde.tokens.circle.diag import w1_circle

    cdf = {}
    for m in (128, 512, 2048):
        out = tempdir / f"m{m}"
        assert main(["transport", str(ROOT / "demos" / "circle.toml"), "--out", str(out), "--quiet", "--set",
                     "tokens.solver='flow'", "--set", f"tokens.labels={m}"]) == 0
        sample = json.loads((out / "report.json").read_text())["samples"][0]
        assert sample["t"][-1] == 1.5 and sample["clusters_T"] == 3, (m, sample["clusters_T"])  # "three collapsed"
        cdf[m] = np.array(sample["cdf_T"])
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
    the noisy circle and sphere: their sub-steps, and the noisy sphere's mass error docs/sphere.md states; the rate
    with F* = F(ρ_S) against the report's that docs/outputs.md states (timings are not compared)."""
    import csv
    import json

    import numpy as np

    from mfpde.cli import main
    from mfpde.fitting import fit_rate_offset

    guide = (DOCS / "user-guide.md").read_text()
    rows = {m[0]: m[1] for m in re.findall(r"^\| `(\w+)\.toml` \| .* \| (.*?) \|$", guide, re.M)}
    got = {}
    for name in ("shallow", "value_heads", "gaussian_2d"):
        out = tempdir / name
        assert main(["run", str(ROOT / "demos" / f"{name}.toml"), "--out", str(out), "--quiet",
                     "--set", "output.plots=false"]) == 0
        got[name] = (json.loads((out / "report.json").read_text()), list(csv.DictReader((out / "history.csv").open())))
    rep, h = got["shallow"]
    assert f"rate: fitted {rep['rate']['fitted']:.2f}, theory {rep['rate']['theory']:.1f}" in rows["shallow"]
    s, f = (np.array([float(r[k]) for r in h]) for k in ("s", "free_energy"))  # docs/outputs.md: F* = F(ρ_S) biased
    gap = f - f[-1]  # the rate, on the same rows as the report's fit (mfpde.training.theory.certified_fit)
    win = (gap >= 10 * rep["rate"]["certificate"]) & (gap > 1e-14 * max(1.0, abs(f[-1])))
    biased = fit_rate_offset(s[win], f[win], f[-1], f[-1])[0]
    outputs = " ".join((DOCS / "outputs.md").read_text().split())
    want = f"the rate high ({biased:.3f} for {rep['rate']['fitted']:.3f} with `mfpde run demos/shallow.toml`)"
    assert want in outputs, want
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
        sample = json.loads((out / "report.json").read_text())["samples"][0]
        steps = sample["substeps"]
        assert f"({shown(steps)} sub-steps)" in rows[name], (name, steps, rows[name])
        if name == "noisy_sphere":  # docs/sphere.md's noisy tokens state the same run
            sphere = " ".join((DOCS / "sphere.md").read_text().split())
            assert f"(mass error {sample['mass_error']:.0e} after {steps} sub-steps in the demo)" in sphere, sample


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


def _continued(tempdir: Path, demo: str, name: str, *sets: str) -> dict:
    """`mfpde continuation demos/<demo>.toml --set ...`: its report.json."""
    import json

    from mfpde.cli import main

    out = tempdir / name
    args = [a for s in sets for a in ("--set", s)]
    assert main(["continuation", str(ROOT / "demos" / f"{demo}.toml"), "--out", str(out), "--quiet", *args]) == 0
    return json.loads((out / "report.json").read_text())


def _event(rep: dict, kind: str, mode: int = 1) -> dict:
    (e,) = [e for e in rep["bifurcations"] if e["kind"] == kind and e["mode"] == mode]
    return e


def test_the_noisy_continuation_diagrams_numbers_are_regenerated(tempdir):
    """docs/continuation.md (the circle at β = 4, the sphere at β = 3 and 5) and docs/phase_transitions.md (the
    hysteresis prose's K_c and K_f, the curvatures c₂): `mfpde continuation demos/noisy_circle.toml` and
    `demos/noisy_sphere.toml`, with the `--set` overrides the pages give for the other β (five runs, seconds)."""
    import scipy.special

    c4 = _continued(tempdir, "noisy_circle", "c4")
    c2 = _continued(tempdir, "noisy_circle", "c2", "tokens.beta=2.0", "continuation.start=1.0", "continuation.stop=2.0")
    s3 = _continued(tempdir, "noisy_sphere", "s3")
    s1 = _continued(tempdir, "noisy_sphere", "s1", "tokens.beta=1.0", "continuation.start=2.0", "continuation.stop=4.0")
    s5 = _continued(tempdir, "noisy_sphere", "s5", "tokens.beta=5.0", "continuation.start=0.3")
    cont = " ".join((DOCS / "continuation.md").read_text().split())
    kc, kf = _event(c4, "subcritical")["parameter"], _event(c4, "fold")["parameter"]
    for want in (f"fold at K = {kf:.4f} |", f"stable up to K_c = {kc:.6f} and the one-cluster state from the fold at "
                 f"K = {kf:.6f} on"):
        assert want in cont, want
    sphere = cont.split("## The sphere")[1]
    fold = _event(s3, "fold")
    assert f"fold at K = {fold['parameter']:.6g} |" in sphere
    assert f"| K = {fold['parameter']:.9f}, \\|∫ x dμ\\| = {fold['order_parameter']:.4f} |" in sphere
    assert f"slope dK/da = {_event(s5, 'transcritical', 2)['slope']:.3f}".replace("-", "−") in sphere
    phase = " ".join((DOCS / "phase_transitions.md").read_text().split())
    c = [_event(r, k)["curvature"] for r, k in ((c2, "supercritical"), (c4, "subcritical"), (s1, "supercritical"),
                                               (s3, "subcritical"))]
    want = (f"{c[0]:.3f} (circle, β = 2), {c[1]:.3f} (circle, β = 4), {c[2]:.3f} (sphere, β = 1), {c[3]:.3f} "
            "(sphere, β = 3)").replace("-", "−")
    assert f"The curvatures c₂ at the branch point: {want}" in phase, c
    grow = 0.41 * float(scipy.special.iv(1, 4.0)) / 4.0 - 1.0  # K I_1(β)/β − τ at K = 0.41, β = 4, τ = 1
    for want in (f"to K = 0.41, just above K_c = {kc:.6f}", f"K I_1(β)/β − τ = {_sci(grow)} per unit depth",
                 f"down to the fold K_f = {kf:.6f} (continuation)"):
        assert want in phase, want


def _sci2(x: float) -> str:
    """x to two digits as the docs print it: 1.4·10⁻⁹."""
    mant, exp = f"{x:.1e}".split("e")
    return f"{mant}·10{str(int(exp)).translate(str.maketrans('-0123456789', '⁻⁰¹²³⁴⁵⁶⁷⁸⁹'))}"


def test_the_noisy_threshold_tables_are_regenerated():
    """docs/continuation.md's tables of measured K_c and β* (the collocation, by the functions the page names) and
    docs/phase_transitions.md's |dc₂/dβ| (about a CPU second)."""
    from mfpde.verify.noise import (
        C2_ERROR,
        beta_star_closed_form,
        closed_threshold,
        measured_beta_star,
        measured_threshold,
    )

    text = " ".join((DOCS / "continuation.md").read_text().split())
    circle, sphere = text.split("## The sphere")
    cases = {"circle": [(1.0, 1.0), (2.0, 1.0), (4.0, 1.0)],
             "sphere": [(0.5, 1.0), (1.0, 1.0), (2.0, 0.3), (4.0, 1.0), (8.0, 0.5)]}
    slopes = {}
    for domain, page, n, stars in (("circle", circle, 41, (41,)), ("sphere", sphere, 40, (24, 40))):
        kc = [measured_threshold(b, t, n, domain, "collocation") for b, t in cases[domain]]
        err = max(abs(k / closed_threshold(domain, b, t) - 1) for k, (b, t) in zip(kc, cases[domain], strict=True))
        row = re.search(rf"\| K_c, β = [^|]*N = {n} \| ([^|]*) \| [^|]* \| ≤ ([^|]*) relative \|", page)
        assert row, (domain, "K_c row")
        assert row[1] == ", ".join(f"{k:.15g}" for k in kc) and row[2] == _sci2(err), (row[0], kc, err)
        star = [measured_beta_star(1.0, m, domain, "collocation") for m in stars]
        ref = beta_star_closed_form(domain)
        slopes[domain] = star[-1][1]
        root = "I₂/I₁ = 1/2" if domain == "circle" else "I_{5/2}/I_{3/2} = 1/3"
        want = (f"| {'; '.join(f'{s:.9f}' for s, _ in star)} | root of {root}: {ref:.9f} | "
                f"{'; '.join(_sci2(abs(s - ref)) for s, _ in star)} (threshold {_sci2(C2_ERROR / star[-1][1])}) |")
        assert want in page, want
    phase = " ".join((DOCS / "phase_transitions.md").read_text().split())
    assert f"|dc₂/dβ| ({slopes['circle']:.2f} on the circle, {slopes['sphere']:.2f} on the sphere:" in phase, slopes


def test_the_sphere_pages_closed_forms_and_mesh_areas_are_regenerated():
    """docs/sphere.md: the fastest degree ℓ_max(β), the kernel's degree L for the flow solver's and DG's Bessel
    tails, the tilted kernel's centres at β = 20, the allreduce's bytes at β = 9 (closed forms, by the functions
    of mfpde.tokens.sphere), and the icosahedral meshes' area shortfall (the function the page names); a second."""
    import math

    from mpi4py import MPI

    from mfpde.tokens.sphere.mesh import icosphere, sphere_area
    from mfpde.tokens.sphere.series import harmonic_degree
    from mfpde.tokens.sphere.theory import fastest_degree
    from mfpde.tokens.sphere.tilted import fibonacci_centres, tilt_radius

    text = " ".join((DOCS / "sphere.md").read_text().split())
    listed = re.search(r"The fastest degree ℓ_max\(β\) \((.*?)\) sets", text)
    assert listed, "sphere.md's list of ℓ_max"
    pairs = re.findall(r"(\d+) at β = (\d+)(?:–(\d+))?", listed[1])
    assert len(pairs) == 5, listed[1]
    for degree, lo, hi in pairs:
        assert all(fastest_degree(b) == int(degree) for b in range(int(lo), int(hi or lo) + 1)), (degree, lo, hi)
    flow, dg = ([harmonic_degree(b, tol) for b in (5, 9, 16)] for tol in (1e-14, 1e-10))
    assert (f"below 1e-14 (L = {flow[0]}, {flow[1]}, {flow[2]} at β = 5, 9, 16) for the flow solver, 1e-10 for DG, "
            f"whose own error is far larger (L = {dg[0]}, {dg[1]}, {dg[2]})") in text, (flow, dg)
    assert f"(K ≈ 8β²/{tilt_radius(1e-6):.1f}², {len(fibonacci_centres(tilt_radius(1e-6) / 20))} at β = 20)" in text
    assert f"8(L+1)² bytes per evaluation ({8 * (flow[1] + 1) ** 2 / 1e3:.1f} kB at β = 9)" in text
    short = {order: [f"{1 - sphere_area(icosphere(MPI.COMM_SELF, r, order)) / (4 * math.pi):.1e}".replace("e-0", "e-")
                     for r in (2, 3, 4)] for order in (1, 2)}
    assert (f"r = 2, 3, 4: {', '.join(short[1])} flat; {', '.join(short[2])} quadratic") in text, short


def test_the_sphere_pages_flow_runs_are_regenerated(tempdir):
    """docs/sphere.md: `mfpde transport demos/sphere.toml --set tokens.solver='"flow"'` with the default labels
    (explicit steps only, their count; the kernel's degrees at β = 5, 9, 16; the direct sum) and with
    `--set tokens.labels=512` (the collapsed clusters at t = 12); about 6 CPU s (the CPU times are not compared)."""
    import json

    from mfpde.cli import main

    words = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
    text = " ".join((DOCS / "sphere.md").read_text().split())
    got = {}
    for labels in (None, 512):
        out = tempdir / f"flow{labels}"
        extra = ["--set", f"tokens.labels={labels}"] if labels else []
        assert main(["transport", str(ROOT / "demos" / "sphere.toml"), "--out", str(out), "--quiet", "--set",
                     "tokens.solver='flow'", "--set", "output.plots=false", "--set", "output.fields=false",
                     *extra]) == 0
        got[labels] = json.loads((out / "report.json").read_text())["samples"][0]
    from mfpde.tokens.sphere.kernel import DEFAULT_TOL, harmonic_degree

    degrees = re.search(r"\(L = (\d+), (\d+), (\d+) at β = 5, 9, 16\) for the flow solver", text)
    assert degrees and [int(g) for g in degrees.groups()] == [harmonic_degree(b, DEFAULT_TOL) for b in (5, 9, 16)]
    # the demo's 128 particles (and 512) are summed directly: no series, no degree
    assert got[None]["kernel"] == got[512]["kernel"] == "direct" and got[None]["kernel_degree"] is None
    demo = got[None]["integrator"]
    assert demo["stiff_steps"] == 0 and demo["switch_t"] is None
    assert f"`--set tokens.solver='\"flow\"'`) stays explicit: {demo['explicit_steps']} steps" in text, demo
    s = got[512]
    assert s["labels"] == 512 and s["t"][-1] == 12.0
    assert f"collapsed to a point ({words[s['clusters_T']]} at t = 12)" in text, s["clusters_T"]
    assert f"{words[s['clusters_T']]} collapsed clusters at t = 12" in text


def test_the_circle_atlas_closed_form_rows_are_regenerated():
    """docs/circle.md's atlas table: the rows of linear theory, k_max(β) and the runner-up's rate over γ_max from
    γ_k = k² I_k(β)/β (scipy), √(2β), and the least-squares c √(β log β) through k_max with its c (closed forms;
    the PDE's cluster counts are `python bench/circle_atlas.py`'s, not regenerated here)."""
    import numpy as np
    import scipy.special

    lines = (DOCS / "circle.md").read_text().splitlines()
    (head,) = [r for r in lines if r.startswith("| β | 1 | 2 |")]
    betas = np.array([float(b) for b in head.strip("| ").split(" | ")[1:]])
    rows = {r.split(" | ")[0].strip("| "): r.strip("| ").split(" | ")[1:] for r in lines
            if r.startswith(("| k_max(β) (linear theory)", "| runner-up rate", "| √(2β)", "| 0.76 √(β log β)"))}
    assert len(rows) == 4, rows.keys()
    k = np.arange(1, 80)
    kmax, ratio = [], []
    for beta in betas:
        g = k**2 * scipy.special.ive(k, beta)
        top = np.argsort(g)[::-1]
        kmax.append(int(k[top[0]]))
        ratio.append(f"{g[top[1]] / g[top[0]]:.2f}")
    assert rows["k_max(β) (linear theory)"] == [str(m) for m in kmax], kmax
    assert rows["runner-up rate / γ_max"] == ratio, ratio
    assert rows["√(2β)"] == [f"{x:.1f}" for x in np.sqrt(2 * betas)]
    s = np.sqrt(betas * np.log(betas))
    c = float(s @ np.array(kmax) / (s @ s))
    text = " ".join((DOCS / "circle.md").read_text().split())
    assert f"through k_max (c = {c:.2f})" in text, c
    assert rows["0.76 √(β log β)"] == [f"{x:.1f}".replace("0.0", "0") for x in c * s]
    assert f"to {kmax[-1] - c * s[-1]:.1f} at β = {betas[-1]:g}".replace("-", "−") in text


def test_the_circle_pages_merge_command_runs_as_stated(tempdir):
    """docs/circle.md's command for two clusters to t = 10⁹ with their merge, as the page prints it (a CPU second):
    two clusters form, one merge, one cluster at T = 10⁹."""
    import json
    import shlex

    from mfpde.cli import main

    (block,) = re.findall(r"```sh\n(mfpde transport .*?)```", (DOCS / "circle.md").read_text(), re.S)
    args = shlex.split(block.replace("\\\n", " "))[1:]
    assert "depth.T=1e9" in args
    args[1] = str(ROOT / args[1])
    out = tempdir / "merge"
    assert main([*args, "--out", str(out), "--quiet", "--set", "output.plots=false", "--set",
                 "output.fields=false"]) == 0
    sample = json.loads((out / "report.json").read_text())["samples"][0]
    assert max(sample["clusters_t"]) == 2 and len(sample["merge_times"]) == 1 and sample["clusters_T"] == 1, sample
    assert sample["t"][-1] == 1e9
    assert "two clusters to t = 10⁹ with their merge" in " ".join((DOCS / "circle.md").read_text().split())


def test_the_free_energy_pages_lie_law_rates_are_regenerated():
    """docs/free_energy.md: the exact Lie law's asymptotic rates in the table and the prose, the continuous-time
    rate and the theorem's rate of the scalar heads, from `lie_law` and `fixed_point` of bench/fe_models.py (the
    closed forms bench/bench_free_energy.py prints; a second or two). The runs' gaps and fitted rates are the
    benchmark's (minutes), not regenerated here."""
    import sys

    sys.path.insert(0, str(ROOT / "bench"))
    from fe_models import fixed_point, lie_law

    horizon = {"value": 16.0, "scalar": 14.0}  # bench_free_energy.run's S
    page = (DOCS / "free_energy.md").read_text()
    rows = re.findall(r"^\| (value|scalar) \| [^|]*, Δs = ([\d.]+) \| .*; ([\d.]+)\) \|$", page, re.M)
    assert len(rows) == 12, rows
    rate = {(fam, ds): f"{lie_law(fam, float(ds), round(horizon[fam] / float(ds)))[1]:.4f}"
            for fam, ds in {(f, d) for f, d, _ in rows}}
    assert all(rate[(f, d)] == shown for f, d, shown in rows), (rate, rows)
    text = " ".join(page.split())
    fp = {fam: fixed_point(fam) for fam in ("value", "scalar")}
    assert (f"the Lie law's {rate[('value', '0.1')]} at Δs = 0.1 against {rate[('value', '0.05')]} at 0.05, "
            f"{rate[('value', '0.5')]} at 0.5 and {fp['value']['rate']:.4f} in continuous time") in text
    assert f"2αλ is 2λ₂ = {fp['value']['theorem']:g} for value heads" in text
    assert f"known only at ρ*, where it gives {fp['scalar']['theorem']:.2f}" in text


def test_the_free_energy_pages_pde_rows_are_regenerated():
    """docs/free_energy.md's table *PDE: refinement and rates*, every row (value heads on 30–120 cells, scalar heads
    on 20²–40², closed-form δR/δρ or token solve, Δs = 0.05, 0.1, 0.5): the gap at s = 0, the final gap and λ KL,
    the fitted rate and the exact Lie law's rate on the same rows, by `pde` of bench/fe_runs.py as
    bench/bench_free_energy.py runs it, and the prose's rate errors and their fitted orders (about 12 CPU s).
    Final values at round-off (|x| < 1e-15) are compared as round-off, not digit by digit."""
    import sys

    import numpy as np

    sys.path.insert(0, str(ROOT / "bench"))
    from fe_models import lie_law
    from fe_runs import pde

    from mfpde.fitting import fit_order, fit_rate

    horizon = {"value": 16.0, "scalar": 14.0}  # bench_free_energy.run's S
    rows = re.findall(r"^\| (value|scalar) \| (closed form|token solve), (\d+)(?:²)? cells, Δs = ([\d.]+) \| (\S+) \| "
                      r"(\S+) \| (\S+) \| (\S+) \((\S+);", (DOCS / "free_energy.md").read_text(), re.M)
    assert len(rows) == 12, rows
    errors: dict[str, dict[int, float]] = {}
    for fam, label, cells, ds, gap0, gap, kl, fitted, same in rows:
        steps = round(horizon[fam] / float(ds))
        r = pde(fam, int(cells), float(ds), steps, "closed" if label == "closed form" else "token")
        g, s = np.asarray(r["gap"]), np.asarray(r["s"])
        w = (g < 1e-2 * g[0]) & (g > 1e-8 * g[0])
        lie_gap, _ = lie_law(fam, float(ds), steps)
        where = (fam, label, cells, ds)
        assert gap0 == f"{g[0]:.3e}" and fitted == f"{fit_rate(s[w], g[w]):.4f}", (where, g[0])
        c, c_lie = fit_rate(s[w], g[w]), fit_rate(s[w], np.asarray(lie_gap)[w])
        assert same == f"{c_lie:.4f}", where
        if label == "token solve" and ds == "0.1":
            errors.setdefault(fam, {})[int(cells)] = abs(c - c_lie)
        for cell, x in ((gap, g[-1]), (kl, r["cert"][-1])):
            want = f"{x:.1e}" if x >= 0 else f"−{-x:.1e}"
            assert cell == want or (abs(x) < 1e-15 and abs(float(cell.replace("−", "-"))) < 1e-15), (where, cell, x)
    text = " ".join((DOCS / "free_energy.md").read_text().split())
    err, order = {}, {}
    for fam, by in errors.items():
        n = sorted(by)
        err[fam] = [f"{by[k]:.1e}".replace("e-0", "e-") for k in n]
        order[fam] = f"{fit_order([6.0 / k for k in n], [by[k] for k in n]):.2f}"
    assert f"The fitted orders are {order['value']} for value heads and {order['scalar']} for scalar heads" in text
    assert (f"The rate errors are {err['value'][0]}, {err['value'][1]} and {err['value'][2]} on 30, 60 and 120 cells, "
            f"and {err['scalar'][0]}, {err['scalar'][1]} and {err['scalar'][2]} on 20², 28² and 40²") in text, err


def test_the_spectral_continuations_unknown_counts_are_the_closed_form():
    """docs/continuation.md: the degrees above round-off that the spectral discretisation keeps, 2 I_k(β) >
    10⁻¹⁸ I_0(β) on the circle at β = 4 and (2ℓ+1) i_ℓ(β) > 10⁻¹⁸ i_0(β) on the sphere at β = 3 (scipy)."""
    import scipy.special

    text = " ".join((DOCS / "continuation.md").read_text().split())
    circle = sum(2 * scipy.special.iv(k, 4.0) > 1e-18 * scipy.special.iv(0, 4.0) for k in range(200))
    sphere = sum((2 * n + 1) * scipy.special.spherical_in(n, 3.0) > 1e-18 * scipy.special.spherical_in(0, 3.0)
                 for n in range(200))
    assert f"(2 I_k(β) > 10⁻¹⁸ I_0(β): {circle} at β = 4)" in text, circle
    assert f"(2ℓ+1) i_ℓ(β) > 10⁻¹⁸ i_0(β) ({sphere} at β = 3)" in text, sphere


def test_the_circle_pages_dg_w1_rows_are_regenerated():
    """docs/circle.md's DG table: W1 of μ_0.5 to the flow map at M = 256 on the side-by-side problem A (case A of
    bench/bench_circle.py, its `mfpde_flow` the reference), DG1 and DG2 on n = 32..512 at the default sub-steps,
    and the local orders the table gives (about 25 CPU s; the depth rows, which need a quarter of the sub-steps,
    are not regenerated)."""
    import math
    import sys

    import numpy as np

    sys.path.insert(0, str(ROOT / "bench"))
    from bench_circle import ANGLES, CASES, mfpde_flow

    from mfpde.tokens.attention import HeadMeasure
    from mfpde.tokens.circle.dg import CircleMesh, CircleTransport
    from mfpde.tokens.circle.diag import cdf_at, initial_density, w1_circle

    att, beta, T, modes = CASES["A"]
    ref = mfpde_flow(att, beta, T, modes, 256, 1e-13)
    rows = {r.split(" | ")[0].strip("| "): r.strip("| ").split(" | ")[1:]
            for r in (DOCS / "circle.md").read_text().splitlines() if r.startswith(("| DG1 W1 |", "| DG2 W1 |"))}
    assert len(rows) == 2, rows
    for p in (1, 2):
        ns = (32, 64, 128, 256, 512)
        err = []
        for n in ns:
            mesh = CircleMesh(n, p)
            rep = CircleTransport(mesh, att).solve(initial_density(mesh, "circle_modes", modes),
                                                   HeadMeasure(np.array([beta]), np.array([1.0])), T, 1)
            err.append(w1_circle(cdf_at(mesh, rep.mu_T, ANGLES), ref))
        row = rows[f"DG{p} W1"]
        assert row[:len(ns)] == [f"{e:.1e}".replace("e-0", "e-") for e in err], (p, err)
        assert row[-1] == f"{math.log2(err[0] / err[1]):.1f} → {math.log2(err[-2] / err[-1]):.1f}", (p, row[-1])


def test_the_sphere_flow_fields_integral_of_outputs_md_is_regenerated(tempdir):
    """docs/outputs.md: the sphere flow solver's field integrates to 1 less the flat icosahedron's (refine 4) area
    shortfall, the number the page prints, at every output depth (a short run of demos/sphere.toml)."""
    from mpi4py import MPI

    from mfpde import read_vtx
    from mfpde.cli import main

    out = tempdir / "flow"
    assert main(["transport", str(ROOT / "demos" / "sphere.toml"), "--out", str(out), "--quiet", "--set",
                 "tokens.solver='flow'", "--set", "tokens.labels=512", "--set", "depth.T=0.5", "--set",
                 "output.plots=false"]) == 0
    if MPI.COMM_WORLD.rank == 0:
        mu = read_vtx(out / "fields" / "mu_0.bp")
        got = {round(mu.integral(k), 6) for k in range(len(mu.times))}
        assert len(got) == 1, got
        text = " ".join((DOCS / "outputs.md").read_text().split())
        assert f"({got.pop():.6f} for mass 1)" in text
