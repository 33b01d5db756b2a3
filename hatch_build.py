"""The package's build-time metadata: the ``vllm`` extra's range is the catalogue's releases.

hatchling runs this hook whenever it builds draftmeta's metadata (``pip install -e .``, a wheel,
an sdist). The extras are written in ``pyproject.toml`` under
``[tool.hatch.metadata.hooks.custom.extras]``, all but ``vllm``: its requirement is
:func:`draftmeta.integrations.vllm.versions.vllm_extra` (``"vllm>=0.32,<0.35"``: the oldest
release to the one after the newest), read from the catalogue's module file names. That module
imports nothing but the standard library, so it is loaded here by its path, without importing
draftmeta (whose requirements the build environment lacks).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from hatchling.metadata.plugin.interface import MetadataHookInterface

RELEASE_MODULE = Path("draftmeta") / "integrations" / "vllm" / "versions.py"


def vllm_extra(root: str) -> str:
    """``release.vllm_extra()`` of the checkout at ``root``."""
    spec = importlib.util.spec_from_file_location("_draftmeta_release", Path(root) / RELEASE_MODULE)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load {RELEASE_MODULE} from {root}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    requirement: str = module.vllm_extra()
    return requirement


class ExtrasFromTheCatalogue(MetadataHookInterface):
    """Sets ``optional-dependencies``: the extras of the hook's table, and ``vllm``."""

    def update(self, metadata: dict[str, Any]) -> None:
        extras = {name: list(requirements) for name, requirements in self.config["extras"].items()}
        if "vllm" in extras:
            raise ValueError("pyproject.toml: leave the vllm extra out of "
                             "[tool.hatch.metadata.hooks.custom.extras]; hatch_build.py sets it")
        metadata["optional-dependencies"] = {"vllm": [vllm_extra(self.root)], **extras}
