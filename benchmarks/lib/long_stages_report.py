"""long_stages.py's report: each engine's runs reduced to per-stage medians, the markdown table and its notes."""
from __future__ import annotations

import statistics
from typing import Any, Dict, List, Optional

from benchmarks.lib.common import EngineRun, print_markdown
from benchmarks.lib.long_stages_common import STAGES

HEADER = ["stage", "ours wall s", "ours CPU s", "ours share", "fw wall s", "fw CPU s", "fw share", "bound"]


def medians(runs: List[EngineRun]) -> Dict[str, Any]:
    """Per stage the median wall and the median CPU seconds over the runs (None for a stage not run), and the
    first run's info with the medians of its numbers."""
    records = [run.outputs[0] for run in runs]
    stages: Dict[str, Optional[List[float]]] = {}
    for key, _ in STAGES:
        values = [r["stages"][key] for r in records if r["stages"][key] is not None]
        stages[key] = [statistics.median(v[0] for v in values), statistics.median(v[1] for v in values)] \
            if values else None
    info = dict(records[0]["info"])
    for name, value in info.items():
        if isinstance(value, (int, float)):
            info[name] = statistics.median(r["info"][name] for r in records)
    return {"stages": stages, "info": info, "rounds": len(records)}


def _cells(summary: Optional[Dict[str, Any]], key: str, not_asked: bool) -> List[str]:
    if summary is None:
        return ["", "", ""]
    times = summary["stages"][key]
    if times is None:
        return ["off", "off", ""] if not_asked else ["", "", ""]
    share = times[0] / summary["stages"]["e2e"][0]
    return [f"{times[0]:.2f}", f"{times[1]:.2f}", f"{share:.1%}"]


def encoder_bound(ours: Optional[Dict[str, Any]], fw: Optional[Dict[str, Any]], gflop: float) -> str:
    """The encoder's GFLOP per window, each engine's rate on its windows and, at torch's float32 matmul rate
    (measured in ours' child), the least time ours' windows could take."""
    parts = [f"{gflop:.1f} GFLOP/window"]
    rates = [(name, s["info"]["windows"] * gflop / s["stages"]["encoder"][0]) for name, s in (("ours", ours),
             ("fw", fw)) if s is not None and s["stages"]["encoder"][0] > 0]
    if rates:
        parts.append(", ".join(f"{name} {rate:.0f}" for name, rate in rates) + " GFLOP/s")
    if ours is not None and ours["info"].get("gemm_gflops"):
        peak = ours["info"]["gemm_gflops"]
        parts.append(f"fp32 GEMM {peak:.0f} GFLOP/s: ours >= {ours['info']['windows'] * gflop / peak:.2f} s")
    return "; ".join(parts)


def table_rows(ours: Optional[Dict[str, Any]], fw: Optional[Dict[str, Any]], gflop: float,
               word_timestamps: bool) -> List[List[str]]:
    rows = []
    for key, label in STAGES:
        bound = encoder_bound(ours, fw, gflop) if key == "encoder" else ""
        rows.append([label] + _cells(ours, key, not word_timestamps) + _cells(fw, key, not word_timestamps)
                    + [bound])
    return rows


def print_report(summaries: Dict[str, Optional[Dict[str, Any]]], fw_reason: Optional[str], gflop: float,
                 word_timestamps: bool, audio_s: float) -> List[List[str]]:
    """The table, then what each engine's windows and output were; the rows, for the JSON."""
    ours, fw = summaries.get("ours"), summaries.get("fw")
    rows = table_rows(ours, fw, gflop, word_timestamps)
    print_markdown(HEADER, rows)
    print("(medians over the rounds; share: of the engine's end-to-end wall; CPU: the child process's CPU seconds, "
          "all threads; decoder row: the end-to-end call without words minus the stages timed apart above it; "
          "each row is its own median, so the rows need not add up to the end-to-end row exactly)")
    if fw is None:
        print(f"fw columns empty: {fw_reason}")
    for name, summary in (("ours", ours), ("fw", fw)):
        if summary is None:
            continue
        info = summary["info"]
        text = info["text"]
        print(f"{name}: {audio_s / summary['stages']['e2e'][0]:.1f}x realtime, {info['windows']:.0f} windows "
              f"(encoder {info['encoder_batch']:.0f} per call), {info['speech_s']:.0f} s of speech after VAD, "
              f"{info['segments']:.0f} segments ({info['fallback_segments']:.0f} from a fallback temperature), "
              f"text {len(text.split())} words: {text[:80]!r}...")
    return rows
