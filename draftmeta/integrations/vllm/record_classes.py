"""Record the field lists of the installed vLLM's metadata classes (one JSON file per release).

``python -m draftmeta.integrations.vllm.record_classes`` writes
``draftmeta/backends/recorded/vllm-<release>.json`` for every class the installed release's
catalogue names: the stand-ins :func:`~draftmeta.backends.vllm_classes.load_metadata_class`
builds where vLLM is not installed (the GPU benchmark machine), and the lists ``explain`` declares
specs from without importing vLLM. Run it once per supported release, in an environment that
has it.
"""

from __future__ import annotations

import json

from draftmeta.backends.vllm_classes import (
    ClassRef,
    annotation_text,
    field_list,
    installed_vllm_version,
    recorded_path,
)

__all__ = ["main", "record"]


def record(refs: list[ClassRef]) -> dict[str, object]:
    """Field lists of ``refs`` from the installed vLLM (imported, else source-parsed), with the
    installed version: ``{"vllm": "0.33.0", "classes": {"module.Class": [[name, annotation],
    ...]}}``. A class the release does not ship is left out."""
    classes: dict[str, list[list[str]]] = {}
    for ref in refs:
        try:
            fields = field_list(ref)
        except (ImportError, LookupError):  # a class this release does not ship
            continue
        classes[str(ref)] = [[name, annotation_text(a)] for name, a in fields]
    return {"vllm": installed_vllm_version(), "classes": classes}


def main() -> None:
    """Record every class the installed release's catalogue names into its JSON file."""
    from draftmeta.integrations.vllm.catalogue import current_release

    release = current_release()
    refs = {ref for entry in release.builders for ref in entry.classes}
    data = record(sorted(refs, key=str))
    classes = data["classes"]
    assert isinstance(classes, dict)
    path = recorded_path()
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"recorded {len(classes)} classes of vLLM {data['vllm']} in {path}")


if __name__ == "__main__":
    main()
