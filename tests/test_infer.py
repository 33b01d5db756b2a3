"""draftmeta infer: probe a builder, classify its fields, emit and verify the spec."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from draftmeta.derivations import CopyFrom
from draftmeta.infer import TodoHook, infer_spec, verify_generic
from draftmeta.rules import Alias, Derive, HostConstant, Recompute, Unchanged, copy_of
from draftmeta.state import DraftState


@dataclasses.dataclass
class PagedDecodeMetadata:
    """The guide's paged decode example, reduced to what a CPU builder makes."""

    num_reqs: int
    max_query_len: int
    max_seq_len: int
    seq_lens: torch.Tensor
    slot_mapping: torch.Tensor
    block_table: torch.Tensor
    positions: torch.Tensor
    req_of_token: torch.Tensor
    prefill: object | None = None


def build_paged(state: DraftState) -> PagedDecodeMetadata:
    """The example builder: views of the state, its own copy of the positions."""
    rows = state.batch_size
    req = torch.arange(rows, dtype=torch.int32)
    req[state.num_reqs:] = 0
    return PagedDecodeMetadata(
        num_reqs=state.num_reqs, max_query_len=1, max_seq_len=state.max_seq_len,
        seq_lens=state.seq_lens, slot_mapping=state.slot_mapping,
        block_table=state.block_table, positions=state.positions.clone(), req_of_token=req,
    )


def test_the_paged_example_is_inferred_rule_by_rule() -> None:
    inference = infer_spec(PagedDecodeMetadata, build_paged, block_size=16)
    assert inference.rules == {
        "num_reqs": HostConstant(),
        "max_query_len": HostConstant(),
        "max_seq_len": copy_of("state.max_seq_len"),
        "seq_lens": Alias("seq_lens"),
        "slot_mapping": Alias("slot_mapping"),
        "block_table": Alias("block_table"),
        "positions": Derive(CopyFrom(), ("state.positions",)),
        "req_of_token": Unchanged(),
        "prefill": Unchanged(),
    }
    assert not inference.unsettled


def test_the_inferred_paged_spec_verifies_over_both_policies() -> None:
    inference = infer_spec(PagedDecodeMetadata, build_paged, block_size=16)
    result = verify_generic(inference.spec(), build_paged, build_paged, block_size=16,
                            batches=40)
    assert result.ok, result.failures[:3]


def test_a_deliberately_wrong_rule_fails_verification() -> None:
    inference = infer_spec(PagedDecodeMetadata, build_paged, block_size=16)
    wrong = inference.spec({"max_seq_len": HostConstant()})
    result = verify_generic(wrong, build_paged, build_paged, block_size=16, batches=40)
    assert not result.ok
    assert any("max_seq_len" in problem for _, problem in result.failures)


def test_the_emitted_source_declares_the_same_rules_with_evidence() -> None:
    inference = infer_spec(PagedDecodeMetadata, build_paged, block_size=16)
    text = inference.source()
    assert "# shares storage with state.seq_lens" in text
    namespace: dict[str, Any] = {"__name__": "emitted", "PagedDecodeMetadata": PagedDecodeMetadata}
    exec(compile(text.replace(f"from {__name__} import", "# "), "<emitted>", "exec"), namespace)
    assert namespace["spec"]().rules == inference.rules


@dataclasses.dataclass
class MysteryMetadata:
    """A builder with a field no library derivation explains."""

    seq_lens: torch.Tensor
    doubled: torch.Tensor


def build_mystery(state: DraftState) -> MysteryMetadata:
    """``doubled`` is twice the lengths: no derivation of the library computes that."""
    return MysteryMetadata(state.seq_lens, state.seq_lens * 2)


def test_an_unexplained_field_gets_a_stub_whose_check_fails() -> None:
    inference = infer_spec(MysteryMetadata, build_mystery, block_size=16)
    assert [v.path for v in inference.unsettled] == ["doubled"]
    rule = inference.rules["doubled"]
    assert isinstance(rule, Recompute) and isinstance(rule.hook, TodoHook)
    assert "TODO" in (rule.hook.check(torch.zeros(1)) or "")
    assert "class TodoDoubledHook(RecomputeHook)" in inference.source()
    result = verify_generic(inference.spec(), build_mystery, build_mystery, block_size=16,
                            batches=4)
    assert not result.ok


# -- vLLM's builders -------------------------------------------------------------------------

JUSTIFIED: dict[str, dict[str, str]] = {
    "INDEXER": {
        "decode.block_table": "Alias: the builder passes the state's view on this path; the "
                              "hand-written copy also serves metadata captured from a dummy batch",
        "decode.seq_lens": "Alias: as decode.block_table (hand-written: flattened copy)",
        "decode.decode_lens": "Unchanged: 1 at every step (hand-written refills 1)",
        "decode.per_req_decode_lens": "Unchanged: as decode.decode_lens",
    },
    "AMX_MLA": {
        "decode.num_kv_splits": "reads state.max_seq_len, which the metadata's max_seq_len "
                                "copies (hand-written reads max_seq_len)",
    },
}
"""Where an inferred spec differs from the hand-written one (policy "advance"), and why."""


def _vllm_names() -> list[str]:
    try:
        from draftmeta.integrations.vllm.testing.harness import builder_names

        return list(builder_names())
    except Exception:
        return []


@pytest.mark.parametrize("name", _vllm_names())
def test_a_vllm_builder_inferred_spec_matches_the_hand_written_one_and_verifies(
    name: str,
) -> None:
    pytest.importorskip("vllm")
    from draftmeta.integrations.vllm.catalogue import builder_spec
    from draftmeta.integrations.vllm.tools.infer import infer_vllm, verify_vllm

    inference = infer_vllm(name)
    assert not inference.unsettled, inference.unsettled
    hand = builder_spec(name, host_bound="advance").rules
    differ = {p for p in hand.keys() | inference.rules.keys()
              if hand.get(p) != inference.rules.get(p)}
    assert differ == set(JUSTIFIED.get(name, {})), (
        {p: (hand.get(p), inference.rules.get(p)) for p in differ})
    result = verify_vllm(name, inference.spec(), batches=12)
    assert result.ok, result.failures[:3]


def test_a_wrong_rule_in_an_inferred_vllm_spec_fails_verification() -> None:
    pytest.importorskip("vllm")
    from draftmeta.integrations.vllm.tools.infer import infer_vllm, verify_vllm

    inference = infer_vllm("TRITON_MLA")
    wrong = inference.spec({"max_seq_len": HostConstant()})
    result = verify_vllm("TRITON_MLA", wrong, batches=12)
    assert not result.ok
    assert any("max_seq_len" in problem for _, problem in result.failures)


def test_the_emitted_indexer_source_keeps_the_deepgemm_kernel_its_inferred_spec_has() -> None:
    """A kernel handed into a hook (hidden from its repr) is written into the emitted source,
    so the pasted spec refills the DeepGEMM schedule on CUDA as the inferred one does."""
    pytest.importorskip("vllm")
    from draftmeta.backends.hooks import DeepGemmPagedMqaSchedule
    from draftmeta.integrations.vllm.specs.indexer import deep_gemm_kernel
    from draftmeta.integrations.vllm.tools.infer import infer_vllm
    from draftmeta.rules import Recompute

    inference = infer_vllm("INDEXER")
    text = inference.source()
    assert "kernel=deep_gemm_kernel" in text
    namespace: dict[str, Any] = {}
    exec(compile(text, "<emitted>", "exec"), namespace)
    rule = namespace["spec"]().rules["decode.schedule_metadata"]
    assert isinstance(rule, Recompute) and isinstance(rule.hook, DeepGemmPagedMqaSchedule)
    assert rule.hook.kernel is deep_gemm_kernel
    assert rule.hook == inference.rules["decode.schedule_metadata"].hook


def test_a_builder_class_resolves_to_its_catalogue_name() -> None:
    pytest.importorskip("vllm")
    from draftmeta.integrations.vllm.tools.infer import resolve

    assert resolve("vllm.v1.attention.backends.mla.indexer:KpoolTailMetadataBuilder") == (
        "KPOOL_TAIL")
    with pytest.raises(LookupError):
        resolve("NO_SUCH_BUILDER")




def test_infer_prints_a_ruff_clean_module_alone_on_stdout_and_its_verdict_on_stderr(
    capsys: pytest.CaptureFixture[str], tmp_path: Any
) -> None:
    import shutil
    import subprocess
    import sys

    pytest.importorskip("vllm", reason="needs vLLM for catalogue names")
    from draftmeta.cli import main

    assert main(["infer", "CPU_MLA", "--batches", "3"]) == 0
    captured = capsys.readouterr()
    assert captured.err.splitlines()[-1].startswith("verified: update equals rebuild")
    spec_py = tmp_path / "spec.py"
    spec_py.write_text(captured.out)
    compile(captured.out, str(spec_py), "exec")  # stdout is one valid module
    ruff = shutil.which("ruff") or shutil.which("ruff", path=str(Path(sys.executable).parent))
    if ruff is None:
        pytest.skip("ruff is not installed here")
    done = subprocess.run([ruff, "check", "--isolated", "--select", "E,F,W,I", str(spec_py)],
                          capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stdout
