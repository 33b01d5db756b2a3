"""The capability protocol at run time and under mypy."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from draftmeta import (
    Alias,
    DraftSpec,
    DraftUpdatable,
    HostAdvance,
    SpecError,
    SupportsDraftUpdate,
    advance_state,
    install_draft_update,
    spec_of,
)
from draftmeta.testing import random_state

CASES = Path(__file__).parent / "typing_cases"


@dataclasses.dataclass
class Meta:
    seq_lens: torch.Tensor
    max_seq_len: int


SPEC = DraftSpec(
    Meta, {"seq_lens": Alias("seq_lens"), "max_seq_len": HostAdvance(clamp="max_model_len")}
)


class Capable(DraftUpdatable[Meta]):
    draft_spec = SPEC


class Plain:
    def build(self) -> None:
        pass


def test_subclass_with_a_spec_is_capable_and_updates() -> None:
    builder = Capable()
    assert isinstance(builder, SupportsDraftUpdate)
    assert spec_of(builder) is SPEC
    state = random_state(torch.Generator().manual_seed(0), batch_size=3, block_size=4,
                         max_model_len=64, steps=2)
    meta = Meta(state.seq_lens, state.max_seq_len)
    advance_state(state)
    builder.update_draft_metadata(meta, state)
    assert meta.max_seq_len == state.max_seq_len


def test_a_plain_builder_is_not_capable() -> None:
    assert not isinstance(Plain(), SupportsDraftUpdate)
    assert spec_of(Plain()) is None


def test_install_on_a_foreign_class() -> None:
    class Foreign:
        pass

    assert install_draft_update(Foreign, SPEC) is Foreign
    assert isinstance(Foreign(), SupportsDraftUpdate)
    assert spec_of(Foreign) is SPEC


def test_a_bad_spec_fails_at_class_creation() -> None:
    with pytest.raises(SpecError, match="has no rule"):

        class Broken(DraftUpdatable[Meta]):
            draft_spec = DraftSpec(Meta, {"seq_lens": Alias("seq_lens")})


def test_base_without_a_spec_says_so() -> None:
    class NoSpec(DraftUpdatable[Meta]):
        pass

    with pytest.raises(TypeError, match="sets no draft_spec"):
        NoSpec().update_draft_metadata(Meta(torch.zeros(1), 1), None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must be a DraftSpec"):

        class Wrong(DraftUpdatable[Meta]):
            draft_spec = "spec"  # type: ignore[assignment]


@pytest.fixture(scope="module")
def mypy_output() -> dict[str, str]:
    """One mypy --strict run over every typing case (torch's stubs make each run slow)."""
    mypy_api = pytest.importorskip("mypy.api", reason="needs mypy (pip install mypy)")
    files = sorted(CASES.glob("*.py"))
    stdout, stderr, _ = mypy_api.run(
        ["--strict", "--no-incremental", "--cache-dir=/dev/null", *map(str, files)]
    )
    assert not stderr, stderr
    lines = stdout.splitlines()
    return {f.name: "\n".join(line for line in lines if f.name in line) for f in files}


def test_mypy_accepts_a_correct_user_module(mypy_output: dict[str, str]) -> None:
    assert mypy_output["good.py"] == ""


def test_mypy_rejects_a_builder_without_the_method(mypy_output: dict[str, str]) -> None:
    out = mypy_output["bad_missing_method.py"]
    assert 'incompatible type "NotCapable"; expected "SupportsDraftUpdate[MyMeta]"' in out
    assert out.count("error:") == 1, out


def test_mypy_rejects_the_wrong_metadata_type(mypy_output: dict[str, str]) -> None:
    out = mypy_output["bad_wrong_metadata.py"]
    assert 'incompatible type "MlaBuilder"; expected "SupportsDraftUpdate[IndexerMeta]"' in out
    assert 'incompatible type "IndexerMeta"; expected "MlaMeta"' in out
    assert out.count("error:") == 2, out


def test_why_not_in_place_is_none_for_a_supported_spec_and_names_what_refuses_the_others() -> None:
    from draftmeta import Reset, Unsupported
    from draftmeta.protocol import why_not_in_place

    assert why_not_in_place(SPEC) is None
    assert why_not_in_place(SPEC, captured=True) is None
    unsupported = DraftSpec(Meta, {"seq_lens": Alias("seq_lens"),
                                   "max_seq_len": Unsupported("a test")}, name="u")
    assert why_not_in_place(unsupported) == "spec 'u' is unsupported (max_seq_len: a test)"
    @dataclasses.dataclass
    class WithScheduler(Meta):
        scheduler: object = None

    reset = DraftSpec(WithScheduler, {**SPEC.rules, "scheduler": Reset(dict)}, name="r")
    assert why_not_in_place(reset) is None  # eager loops may replace a host object
    refusal = why_not_in_place(reset, captured=True)
    assert refusal is not None and refusal.startswith("spec 'r' is not capture-safe (")
