"""Throwaway Python environments for the install tests: a fresh virtual environment that reads
the test run's own environment (vLLM, torch, everything README's set-up installed) after its
own site-packages, as ``noxfile.py``'s release sessions read README's environment.

What is installed into one goes into its own site-packages only, so the test run's environment
is never touched, and it is made in a fraction of a second with no download: pip runs from the
base environment, with no index (``PIP_NO_INDEX``) and no build isolation (the build backend,
hatchling, comes from the ``dev`` extra), so a test that installs something shows it installs
offline from what it builds. Its ``bin/`` comes first on ``PATH``: ``pip``, ``python`` and any
console script installed into it (``draftmeta``) are the environment's own, as in a user's
activated environment.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import attrs
import pytest

__all__ = ["ROOT", "Overlay", "needs_build_backend", "overlay"]

ROOT = Path(__file__).resolve().parents[1]

_PIP = """#!{python}
import sys
from pip._internal.cli.main import main
sys.exit(main())
"""

needs_build_backend = pytest.mark.skipif(
    importlib.util.find_spec("hatchling") is None and os.environ.get("CI") != "true",
    reason="builds wheels offline with hatchling, from the dev extra: pip install -e '.[dev]' "
           "(in CI, where the dev extra is installed, these tests run and fail without it)")
"""For tests that build a wheel: skipped on a machine without hatchling, except in CI."""


@attrs.frozen
class Overlay:
    """A throwaway environment over the test run's one.

    Attributes:
        folder: the virtual environment.
        site_packages: its own site-packages, where everything installed into it goes.
        environ: the environment variables to run its commands with.
    """

    folder: Path
    site_packages: Path
    environ: dict[str, str]

    @property
    def python(self) -> Path:
        """Its interpreter."""
        return self.folder / "bin" / "python"

    def run(self, command: str | list[str], *, cwd: Path = ROOT, check: bool = True,
            env: dict[str, str] | None = None, timeout: float = 600,
            ) -> subprocess.CompletedProcess[str]:
        """Run ``command`` (a shell line, or an argument list) in it, from ``cwd`` (the checkout's
        root), its output captured; with ``check``, a failure raises with both streams."""
        done = subprocess.run(command, shell=isinstance(command, str), cwd=cwd,
                              env={**self.environ, **(env or {})}, capture_output=True,
                              text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise AssertionError(f"{command!r} exited {done.returncode}\n--- stdout\n"
                                 f"{done.stdout[-4000:]}\n--- stderr\n{done.stderr[-6000:]}")
        return done


def overlay(folder: Path) -> Overlay:
    """A new environment in ``folder`` reading this one's packages after its own."""
    venv.EnvBuilder(with_pip=False, symlinks=True).create(folder)
    done = subprocess.run([str(folder / "bin" / "python"), "-c",
                           "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True)
    own = Path(done.stdout.strip())
    bases = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    (own / "_base_environment.pth").write_text(
        "import site; " + "; ".join(f"site.addsitedir({b!r})" for b in bases) + "\n")
    pip = folder / "bin" / "pip"
    pip.write_text(_PIP.format(python=folder / "bin" / "python"))
    pip.chmod(0o755)
    # the checkout itself is not on the path: what runs is what was installed; other entries of
    # PYTHONPATH (a tool placed on the path by hand) are kept
    kept = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
            if p and Path(p).resolve() != ROOT]
    # nor the switches the test run sets for itself (the harness turns the plugin off in-process)
    environ = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONPATH", "PIP_FIND_LINKS", "PIP_INDEX_URL", "VIRTUAL_ENV")
               and not k.startswith("DRAFTMETA_")}
    environ.update(
        PATH=f"{folder / 'bin'}{os.pathsep}{environ.get('PATH', '')}",
        VIRTUAL_ENV=str(folder),
        PIP_NO_INDEX="1",
        # pip reads the variable of its --no-build-isolation flag inverted: "0" turns it on
        PIP_NO_BUILD_ISOLATION="0",
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        **({"PYTHONPATH": os.pathsep.join(kept)} if kept else {}),
    )
    assert sys.version_info >= (3, 10)
    return Overlay(folder, own, environ)
