"""Test setup: vLLM runs on the CPU here, quietly."""

from __future__ import annotations

import os

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

from draftmeta.backends.vllm_classes import ensure_platform_environment

ensure_platform_environment()
