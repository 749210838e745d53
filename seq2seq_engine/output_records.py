"""The JSON record of one text request's result: what `seq2seq-engine generate` writes and Ray's rows carry."""
from __future__ import annotations

from typing import Any, Dict, Optional

from seq2seq_engine.outputs import RequestOutput


def result_fields(output: RequestOutput) -> Dict[str, Any]:
    """A finished request's fields of its output record (all but `index`), in the record's order."""
    best = output.outputs[0]
    prompt = output.encoder_prompt if output.encoder_prompt is not None else output.prompt
    fields = {"prompt": prompt, "text": best.text, "token_ids": best.token_ids, "finish_reason": best.finish_reason,
              "cumulative_logprob": best.cumulative_logprob}
    if len(output.outputs) > 1:
        fields["alternatives"] = [{"text": o.text, "token_ids": o.token_ids,
                                   "cumulative_logprob": o.cumulative_logprob} for o in output.outputs[1:]]
    return fields


def output_record(index: int, fields: Optional[Dict[str, Any]], error: Optional[str]) -> dict:
    """One line of the output file: the input's index with its result fields, or with its error."""
    return {"index": index, "error": error} if fields is None else {"index": index, **fields}
