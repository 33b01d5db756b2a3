"""The generated text is checked in: ``explain`` of every shipped spec and the fused kernel.

A change to a rule, a spec or a generator shows up as a diff of draftmeta/explained (the
shipped explain texts) or tests/golden/fused in review. On a
mismatch the test prints the unified diff and how to regenerate
(``python -m tests.golden.regenerate`` or ``pytest tests/test_golden.py --update-golden``).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from draftmeta.advance import advance_spec
from draftmeta.fused import fused_source
from tests.golden import regenerate as golden

needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None,
    reason="the fused kernel's golden text is generated from vLLM's real builders' metadata",
)

pytestmark = pytest.mark.skipif(
    not golden.installed_release_matches(),
    reason=f"the golden texts describe vLLM {golden.RELEASE}'s catalogue",
)


def _compare(request: pytest.FixtureRequest, folder: Path, texts: dict[str, str]) -> None:
    if request.config.getoption("--update-golden"):
        golden.write(folder, texts)
        return
    diffs = golden.differences(folder, texts)
    if diffs:
        pytest.fail("generated text differs from its golden file:\n" + "\n".join(diffs)
                    + f"\nif the change is intended, regenerate: {golden.REGENERATE}",
                    pytrace=False)


def test_explain_of_every_shipped_spec_matches_its_golden_file(
    request: pytest.FixtureRequest,
) -> None:
    _compare(request, golden.EXPLAIN, golden.explain_texts())


@needs_vllm
def test_the_fused_kernel_of_the_shipped_groups_matches_its_golden_file(
    request: pytest.FixtureRequest,
) -> None:
    _compare(request, golden.FUSED, golden.fused_texts())


@needs_vllm
def test_the_golden_texts_are_the_same_when_generated_twice() -> None:
    assert golden.explain_texts() == golden.explain_texts()
    assert golden.fused_texts() == golden.fused_texts()


def test_a_changed_rule_is_reported_as_a_diff_of_its_explain_text() -> None:
    # negative control: state.clamp declared with the wrap policy instead (positions and
    # sequence lengths wrap rather than clamp) must not match the checked-in text
    texts = golden.explain_texts({"state.clamp": lambda: advance_spec("wrap")})
    diffs = golden.differences(golden.EXPLAIN, texts)
    ours = [d for d in diffs if d.startswith(f"--- golden/{golden.EXPLAIN.name}/state.clamp.txt")]
    assert len(ours) == 1
    assert "\n-" in ours[0] and "\n+" in ours[0] and "wrap" in ours[0]


@needs_vllm
def test_a_changed_rule_is_reported_as_a_diff_of_the_fused_kernel() -> None:
    # negative control: the same groups on a wrapping source advance
    state, groups = golden.fused_groups()
    texts = {name: fused_source(state, groups, policy="wrap", host_bound="advance")
             for name in golden.fused_texts()}
    diffs = golden.differences(golden.FUSED, texts)
    assert len(diffs) == 1 and "+    # draft_state.wrap" in diffs[0]
