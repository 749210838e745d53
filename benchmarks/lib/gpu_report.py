"""The markdown table of benchmarks/gpu_throughput.py's results: one row per workload, batch and engine."""
from __future__ import annotations

from typing import Any, Dict, List

ENGINE_ORDER = ("ours", "hf", "ct2")


def _cell(value, fmt: str = "{:.2f}") -> str:
    return "" if value is None else fmt.format(value)


def _rows(name: str, batch: str, result: Dict[str, Any], unit: str) -> List[List[str]]:
    """Ours first, then each peer with our speed relative to it and the tokens the two share."""
    rows = []
    for engine in [e for e in ENGINE_ORDER if e in result]:
        r = result[engine]
        rounds = " / ".join("failed" if t is None else f"{t:.2f}" for t in r["rounds"])
        ratio = _cell(r.get("speed_ratio"), "{:.2f}x")
        same = r.get("agreement") or {}
        agree = f"{same['identical']:.0%} / {same['common_prefix']:.0%}" if same else ""
        rows.append([name, batch, engine, _cell(r["best_s"]), rounds, _cell(r.get(unit), "{:.1f}"), ratio, agree])
    return rows


def markdown(results: Dict[str, Any]) -> str:
    header = ["workload", "requests", "engine", "best wall s", "rounds s", "RTFx or tok/s", "ours / this speed",
              "same tokens as ours / common prefix"]
    rows = []
    for name, result in results["workloads"].items():
        if "error" in result:
            rows.append([name, "", "", "", result["error"], "", "", ""])
        elif name == "whisper":
            for batch, batch_result in result["batches"].items():
                rows += _rows(name, batch, batch_result, "rtfx")
        else:
            rows += _rows(name, str(result["documents"]), result["result"], "tokens_per_s")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])
