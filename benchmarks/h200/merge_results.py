"""Merge the JSON of ``engine_run.sh`` stages into one GPU e2e result, then write its Markdown
and PNG beside it (``draftmeta.integrations.vllm.e2e.cuda_report.write_cuda_results``).

A stage's configuration replaces the result's configuration with the same key (model, backend,
K, KV-cache dtype, override, negative control, batch size) and is added otherwise; each stage's
command is appended to ``commands``; the summary fields (tokens identical, negative control
caught, failures) are computed again over the merged configurations.

    python benchmarks/h200/merge_results.py benchmarks/results/e2e-cuda.json \\
        /work/.device/5/large/e2e-cuda.json /work/.device/6/large/e2e-cuda.json \\
        --command "bash benchmarks/h200/engine_run.sh ... (on the H200)"
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from draftmeta.integrations.vllm.e2e.cuda_report import write_cuda_results

KEY = ("model", "backend", "k", "kv_cache_dtype", "override_upstream", "negative_control",
       "batch_size")
"""The fields that name one configuration of the GPU e2e table."""

MODEL_ORDER = {"tiny": 0, "large": 1}
BACKEND_ORDER = {"FLASH_ATTN_MLA": 0, "FLASHMLA": 1}
"""vLLM's order of preference on Hopper."""


def _key(config: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(config[name] for name in KEY)


def _order(config: dict[str, Any]) -> tuple[Any, ...]:
    return (config["negative_control"], config["override_upstream"],
            MODEL_ORDER.get(config["model"], 2), config["kv_cache_dtype"] != "auto",
            BACKEND_ORDER.get(config["backend"], 2), config["backend"], config["k"],
            config["batch_size"])


def merge(result: dict[str, Any], stages: list[dict[str, Any]], command: str | None
          ) -> dict[str, Any]:
    """``result`` with the configurations and commands of ``stages`` merged in."""
    configs = {_key(c): c for c in result["configurations"]}
    commands = list(result.get("commands", []))
    failed = list(result.get("failed", []))
    for stage in stages:
        for config in stage["configurations"]:
            configs[_key(config)] = config
        if stage["command"] not in commands:
            commands.append(stage["command"])
        failed += stage.get("failed", [])
    merged = sorted(configs.values(), key=_order)
    timed = [c for c in merged if not c["negative_control"]]
    controls = [c for c in merged if c["negative_control"]]
    return {
        **result,
        "command": command or result["command"],
        "commands": commands,
        "output_tokens_identical": all(c["output_tokens_identical"] for c in timed),
        "draft_tokens_identical": all(c["draft_tokens_identical"] for c in timed),
        "negative_control_caught": (all(not c["draft_tokens_identical"] for c in controls)
                                    if controls else None),
        "configurations": merged,
        "failed": failed,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("result", type=Path, help="the merged result, read and rewritten")
    parser.add_argument("stages", type=Path, nargs="+", help="the stages' e2e-cuda.json files")
    parser.add_argument("--command", help="the new value of the result's 'command' field")
    args = parser.parse_args(argv)
    result = json.loads(args.result.read_text())
    stages = [json.loads(path.read_text()) for path in args.stages]
    merged = merge(result, stages, args.command)
    paths = write_cuda_results(merged, args.result.parent, args.result.stem)
    for kind, path in paths.items():
        print(f"wrote {kind}: {path}")


if __name__ == "__main__":
    main()
