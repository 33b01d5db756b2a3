"""On the H200: can vLLM 0.34 use ``FLASHINFER_MLA`` here? (issue 20, item 6)

Prints the GPU's compute capability, whether FlashInfer imports (it is not carried) and, if
vLLM's FlashInfer-MLA backend imports, whether it declares this capability supported. vLLM 0.34's
``FlashInferMLABackend.supports_compute_capability`` is ``capability.major == 10`` (Blackwell),
so on a Hopper GPU the answer is no even with FlashInfer installed.

    python3 benchmarks/h200/flashinfer_probe.py
"""

from __future__ import annotations


def main() -> None:
    from vllm.platforms import current_platform

    capability = current_platform.get_device_capability()
    print("capability", capability)
    try:
        import flashinfer

        print("flashinfer", flashinfer.__version__)
    except Exception as exc:  # reported, the probe's answer
        print("flashinfer import:", type(exc).__name__, exc)
    try:
        from vllm.v1.attention.backends.mla.flashinfer_mla import FlashInferMLABackend

        print("supports", FlashInferMLABackend.supports_compute_capability(capability))
    except Exception as exc:  # reported, the probe's answer
        print("FLASHINFER_MLA backend import:", type(exc).__name__, exc)


if __name__ == "__main__":
    main()
