"""Rules for dependency lists (NM6xx): requirements*.txt, pyproject.toml, setup.py, setup.cfg, environment.yml.

TorchNeuron ships as `torch-neuronx` in one family per PyTorch release: 2.13.x for torch 2.13.0 and 2.14.x for
torch 2.14.0 (Neuron 2.33 release notes; install with `torch-neuronx==2.14.*`). Earlier torch-neuronx versions
(`2.1.2.2.x` ... `2.9.0.2.15.x`) are the XLA-based library and need torch-xla; both share the package name, so
they cannot coexist.
"""
from __future__ import annotations

import re

from neuron_migrate.rules.api import rule

TYPE_CHECKING = False  # typing is not imported at run time (start-up): it serves annotations only
if TYPE_CHECKING:
    from typing import Optional

RELEASE_NOTES = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/release-notes/components/torchneuron.html"
INSTALL_DOC = "https://awsdocs-neuron.readthedocs-hosted.com/en/v2.33.0/_sources/setup/pytorch/update-manual.rst"
FAMILIES = {"2.13": "2.13.0", "2.14": "2.14.0"}  # torch-neuronx family -> the torch it is built for
NEWEST = "2.14"


def _family_of(spec: str, conda: bool = False) -> Optional[str]:
    """The (major.minor) family a specifier pins: "2.13", "2.14", another "X.Y", "" when it allows several or
    anything (unpinned)."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet
    from packaging.version import InvalidVersion, Version

    spec = spec.strip()
    if not spec:
        return ""
    if conda:  # conda: `=2.13.0`, `==2.13`, `2.13.*`, `>=2.13,<2.14`: the first version number decides
        m = re.search(r"(\d+)\.(\d+)", spec)
        return f"{m.group(1)}.{m.group(2)}" if m and ("," not in spec and not spec.startswith((">", "<", "!"))) else ""
    try:
        ss = SpecifierSet(spec)
    except InvalidSpecifier:
        return ""
    for s in ss:
        if s.operator in ("==", "===", "~=") and not s.version.endswith(".*") or s.operator == "==":
            try:
                v = Version(s.version.rstrip(".*").rstrip("."))
            except InvalidVersion:
                continue
            if s.operator == "~=" and len(v.release) == 2:
                continue  # ~=2.13 allows 2.14
            return f"{v.release[0]}.{v.release[1] if len(v.release) > 1 else 0}"
    fams = [f for f in FAMILIES if any(ss.contains(Version(c), prereleases=True) for c in (f + ".0", f + ".3.0", f + ".3.0.100"))]
    if len(fams) == 1:
        return fams[0]
    if not fams and any(s.operator in ("<", "<=") for s in ss):
        return "older"
    return ""


def _allows(spec: str, fam: str) -> bool:
    from packaging.specifiers import InvalidSpecifier, SpecifierSet
    from packaging.version import Version

    try:
        ss = SpecifierSet(spec)
    except InvalidSpecifier:
        return False
    return any(ss.contains(Version(c), prereleases=True) for c in (fam + ".0", fam + ".3.0", fam + ".3.0.100"))


def _torch_site(doc):
    return next((s for s in doc.sites if s.kind == "requirement" and s.key in ("torch", "pytorch")), None)


def _torch_family(doc) -> tuple[Optional[str], Optional[object]]:
    s = _torch_site(doc)
    if s is None:
        return None, None
    return _family_of(s.data["spec"], s.data["conda"]), s


def _neuronx_family(site) -> str:
    return _family_of(site.data["spec"], site.data["conda"])


def _legacy(fam: str) -> bool:
    return fam not in ("", *FAMILIES)


# -- NM600 --------------------------------------------------------------------------------------------
@rule(
    code="NM600",
    name="deps-unparsed",
    summary="A dependency file (or a list in it) the parser could not read: reported, never rewritten",
    fix="none",
    severity="warning",
    triggers=[("document", "*")],
    trigger_words=("torch",),
    language="deps",
    docs="""
        Dependency files are read with their own parsers (TOML, configparser-style sections, `ast` for setup.py, YAML
        for conda) and the requirement strings with `packaging`. A file that does not parse, or a list whose strings
        the scanner could not match one for one with what the parser read, is reported and left unchanged.
    """,
    examples=[("[project]\ndependencies = [\"torch-xla\"\n", None)],
)
def deps_unparsed(doc, ctx):
    if "torch" not in doc.text:
        return None
    return [ctx.finding((a, b), f"{what}: this file is not rewritten") for a, b, what in doc.problems[:1]]


# -- NM601 --------------------------------------------------------------------------------------------
@rule(
    code="NM601",
    name="torch-xla-dependency",
    summary="torch-xla in a dependency list is removed (TorchNeuron is native PyTorch)",
    fix="safe",
    severity="warning",
    triggers=[("requirement", "torch-xla")],
    trigger_words=("torch-xla", "torch_xla", "torch.xla"),
    language="deps",
    docs=f"""
        TorchNeuron runs on plain PyTorch (`torch` plus `torch-neuronx` 2.13/2.14, {RELEASE_NOTES}); torch-xla is not
        needed, and the XLA-based torch-neuronx that needed it cannot be installed next to the native one. The entry is
        removed (its whole line, or the element of an inline list), in requirements files, pyproject `[project]`
        dependencies and optional dependencies, setup.py/setup.cfg lists and conda environments (pip section too).
        An entry that is the only one of its list is reported instead (an emptied list is easy to miss in review).
        Extras (`torch-xla[tpu]`) and find-links lines for libtpu stay for you to remove.
    """,
    examples=[("torch==2.14.0\ntorch-xla==2.9.0\n", "torch==2.14.0\n")],
)
def torch_xla_dependency(site, ctx):
    delete = site.data.get("delete")
    if not delete:
        return ctx.finding(site, f"{site.data['text']}: torch-xla is not used by TorchNeuron; remove it by hand (only entry of its list)")
    fx = ctx.fixer()
    fx.delete(*delete)
    return ctx.finding(site, f"{site.data['text']}: torch-xla is not used by TorchNeuron: {ctx.did('removed', 'remove it')}", fix=fx.build())


# -- NM602 --------------------------------------------------------------------------------------------
@rule(
    code="NM602",
    name="torch-neuronx-family",
    summary="torch-neuronx pinned to the family of the torch pin (2.13.* for torch 2.13.0, 2.14.* for 2.14.0)",
    fix="safe",
    severity="warning",
    triggers=[("requirement", "torch-neuronx")],
    trigger_words=("torch-neuronx", "torch_neuronx"),
    language="deps",
    docs=f"""
        Install the torch-neuronx family that matches PyTorch: `torch-neuronx==2.13.*` with torch 2.13.0,
        `torch-neuronx==2.14.*` with torch 2.14.0 ({RELEASE_NOTES}; {INSTALL_DOC}). An XLA-era pin (`2.1.2.2.x` ...
        `2.9.0.2.15.x`, the legacy library that needs torch-xla) is repinned to the family of the file's torch pin
        (safe fix); with no torch pin in the file it is repinned to the newest family, `2.14.*`, as an unsafe fix (pin
        torch==2.14.0 as well). An unpinned torch-neuronx next to a torch pin gets that family, and so does a range that
        also allows another family (`torch-neuronx>=2.13` with torch 2.13.0 could install 2.14.x). `neuronx-cc` is
        kept as it is. A torch-neuronx family that differs from the torch pin is NM603.
    """,
    examples=[("torch==2.13.0\ntorch-neuronx==2.9.0.2.15.32035\n", "torch==2.13.0\ntorch-neuronx==2.13.*\n")],
)
def torch_neuronx_family(site, ctx):
    tf, tsite = _torch_family(ctx.doc)
    nf = _neuronx_family(site)
    a, b = site.data["spec_range"]
    if nf and not _legacy(nf):
        return None  # native family: NM603 compares it with torch
    if tf in FAMILIES:
        if nf == "" and site.data["spec"] and not _allows(site.data["spec"], tf):
            return None  # a range without the torch family: NM603
        fx = ctx.fixer()
        fx.replace(a, b, f"=={tf}.*")
        what = (f"XLA-era {site.data['text']}" if nf else f"{site.data['text']} (a range that also allows other families)"
                if site.data["spec"] else "torch-neuronx without a version")
        pinned = ctx.did(f"pinned to torch-neuronx=={tf}.*", f"pin it to torch-neuronx=={tf}.*")
        return ctx.finding(site, f"{what}: {pinned}, the family built for torch {FAMILIES[tf]} (the torch pin here)",
                           fix=fx.build(), note=f"source: {RELEASE_NOTES}")
    if nf and _legacy(nf) and tf in (None, ""):
        fx = ctx.fixer("unsafe")
        fx.replace(a, b, f"=={NEWEST}.*")
        return ctx.finding(site, f"XLA-era {site.data['text']} (the legacy library, needs torch-xla): TorchNeuron is torch-neuronx=={NEWEST}.* "
                                 f"with torch {FAMILIES[NEWEST]} or 2.13.* with torch 2.13.0; no torch pin here to choose from",
                           fix=fx.build(), note="pin torch==2.14.0 next to it (unsafe fix: also changes which torch pip installs)")
    if nf and _legacy(nf):
        return ctx.finding(site, f"XLA-era {site.data['text']}: TorchNeuron needs torch 2.13.0 or 2.14.0 first (see NM603)")
    return None


# -- NM603 --------------------------------------------------------------------------------------------
@rule(
    code="NM603",
    name="torch-family-mismatch",
    summary="torch and torch-neuronx pins of different families, or a torch pin no TorchNeuron build exists for",
    fix="none",
    severity="error",
    triggers=[("requirement", "torch-neuronx"), ("requirement", "torch"), ("requirement", "pytorch")],
    trigger_words=("torch",),
    language="deps",
    docs=f"""
        torch-neuronx 2.13.x is built for torch 2.13.0 and 2.14.x for torch 2.14.0 ({RELEASE_NOTES}); any other pair
        fails to install or to import. Reported as an error (no fix: which of the two pins is the intended one is
        yours to say): a torch-neuronx family that differs from the torch family in the same file, and, when the file
        also names torch-neuronx or torch-xla, a torch pin of a release without TorchNeuron (e.g. the torch 2.1-2.9 of
        the XLA era).
    """,
    examples=[("torch==2.13.0\ntorch-neuronx==2.14.*\n", None)],
)
def torch_family_mismatch(site, ctx):
    tf, tsite = _torch_family(ctx.doc)
    if site.key == "torch-neuronx":
        nf = _neuronx_family(site)
        if nf in FAMILIES and tf in FAMILIES and nf != tf:
            return ctx.finding(site, f"{site.data['text']} is the family built for torch {FAMILIES[nf]}, but torch is pinned to "
                                     f"{tsite.data['text']}: use torch-neuronx=={tf}.* or torch=={FAMILIES[nf]}")
        if nf == "" and site.data["spec"] and tf in FAMILIES and not _allows(site.data["spec"], tf):
            return ctx.finding(site, f"{site.data['text']} allows no torch-neuronx built for torch {FAMILIES[tf]} "
                                     f"({tsite.data['text']}): use torch-neuronx=={tf}.*")
        return None
    if site is not tsite or tf in (None, "") or tf in FAMILIES:
        return None
    neuron = any(s.kind == "requirement" and s.key in ("torch-neuronx", "torch-xla") for s in ctx.doc.sites)
    if not neuron:
        return None
    return ctx.finding(site, f"{site.data['text']}: TorchNeuron is built for torch 2.13.0 (torch-neuronx 2.13.*) and 2.14.0 "
                             f"(2.14.*) only; pin one of those")


# -- NM604 --------------------------------------------------------------------------------------------
@rule(
    code="NM604",
    name="dynamic-dependencies",
    summary="setup.py install_requires/extras_require that is not a literal list: check torch-xla / torch-neuronx by hand",
    fix="none",
    severity="info",
    triggers=[("dynamic-deps", "*")],
    trigger_words=("install_requires", "extras_require"),
    language="deps",
    docs="""
        setup.py dependency lists are read without running setup.py: only literal lists (and dicts of literal lists
        for extras_require) are checked and rewritten. A list built by code (read from requirements.txt, a variable,
        a comprehension) is reported once so that torch-xla / torch-neuronx pins in it are not missed.
    """,
    examples=[("from setuptools import setup\n\nsetup(name='trainer', install_requires=open('requirements.txt').read().split())  # torch, torch-xla\n", None)],
)
def dynamic_dependencies(site, ctx):
    text = ctx.doc.text
    if not re.search(r"torch|neuron", text):
        return None
    return ctx.finding(site, f"{site.key} is built by code, not a literal list: check it for torch-xla and the torch-neuronx "
                             "family by hand")
