"""From RequestOutputs to OpenAI choices: each prompt's n completions numbered prompt_index * n + k, whole (final
responses) or as the text and tokens new since the last chunk (streams), and the usage counts."""
from __future__ import annotations

import dataclasses
from typing import Any, AsyncIterator, Callable, Dict, Iterable, List, Optional, Tuple

from seq2seq_engine.entrypoints.openai.errors import APIError
from seq2seq_engine.entrypoints.openai.event_stream import EventStreamResponse, sse


@dataclasses.dataclass
class Piece:
    """One choice's new text and tokens (all of them in a final response), with their logprob entries."""

    index: int
    text: str
    token_ids: List[int]
    logprobs: Optional[List[Dict[int, float]]]
    finish_reason: Optional[str]
    first: bool  # the choice's first piece (chat streams send the role then)


class ChoiceTracker:
    """Numbers the choices of an HTTP request's engine requests and cuts stream pieces. `incremental`: pieces as
    tokens come (one sequence per prompt); otherwise (n/best_of > 1, beam search: the ranking changes until the end)
    each choice comes whole when its request finishes."""

    def __init__(self, request_ids: List[str], n: int, incremental: bool) -> None:
        self.prompt_index = {request_id: index for index, request_id in enumerate(request_ids)}
        self.n, self.incremental = n, incremental
        self._sent: Dict[int, Tuple[int, int]] = {}  # choice index -> (characters, tokens) sent

    def choices(self, output: Any) -> Iterable[Tuple[int, Any]]:
        base = self.prompt_index[output.request_id] * self.n
        return ((base + completion.index, completion) for completion in output.outputs[:self.n])

    def pieces(self, output: Any) -> List[Piece]:
        """What is new in this output (stream)."""
        if not self.incremental and not output.finished:
            return []
        pieces = []
        for index, completion in self.choices(output):
            chars, tokens = self._sent.get(index, (0, 0))
            text, token_ids = completion.text[chars:], list(completion.token_ids[tokens:])
            if not text and not token_ids and completion.finish_reason is None:
                continue
            logprobs = completion.logprobs[tokens:] if completion.logprobs is not None else None
            pieces.append(Piece(index, text, token_ids, logprobs, completion.finish_reason, index not in self._sent))
            self._sent[index] = (len(completion.text), len(completion.token_ids))
        return pieces

    def final_pieces(self, finals: Dict[str, Any]) -> List[Piece]:
        """Every choice whole, in index order (non-streamed response)."""
        pieces = [Piece(index, completion.text, list(completion.token_ids), completion.logprobs,
                        completion.finish_reason, True)
                  for output in finals.values() for index, completion in self.choices(output)]
        return sorted(pieces, key=lambda piece: piece.index)


def usage(finals: Iterable[Any], n: int) -> Dict[str, int]:
    prompt_tokens = completion_tokens = 0
    for output in finals:
        prompt_tokens += len(output.prompt_token_ids) + len(output.encoder_prompt_token_ids or [])
        completion_tokens += sum(len(completion.token_ids) for completion in output.outputs[:n])
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def token_text(tokenizer: Any, token_id: int) -> str:
    return tokenizer.decode([token_id]) if tokenizer is not None else f"token_id:{token_id}"


def check_ignored(outputs: Iterable[Any]) -> None:
    """A request the scheduler ignored (too long for the model or the KV pool) is the client's error; one that
    failed inside an engine step (aborted alone, the others went on) is the server's."""
    for output in outputs:
        if output.ignored_reason:
            raise APIError(f"the request cannot run: {output.ignored_reason}", param="prompt")
        if output.error:
            raise APIError(f"the engine failed on this request: {output.error}", status=500)


async def stream_choices(requests: Any, tracker: ChoiceTracker, head: Dict[str, Any], include_usage: bool, n: int,
                         render: Callable[[Piece], Dict[str, Any]]) -> AsyncIterator[str]:
    """The stream's events: a chunk per new piece of each choice (`render` makes the choice), then with
    include_usage a last chunk with no choices and the usage (every other chunk has usage null)."""
    finals = []
    async with requests:
        async for output in requests.outputs():
            check_ignored([output])
            for piece in tracker.pieces(output):
                chunk = {**head, "choices": [render(piece)]}
                if include_usage:
                    chunk["usage"] = None
                yield sse(chunk)
            if output.finished:
                finals.append(output)
    if include_usage:
        yield sse({**head, "choices": [], "usage": usage(finals, n)})


def stream_response(requests: Any, tracker: ChoiceTracker, head: Dict[str, Any], body: Any,
                    render: Callable[[Piece], Dict[str, Any]], headers: Dict[str, str]) -> EventStreamResponse:
    """The streamed response of a completions or chat request (`body.n`, `body.stream_options`); leaving it, however
    it ends, closes `requests` (which aborts what is unfinished)."""
    include_usage = body.stream_options is not None and body.stream_options.include_usage
    events = stream_choices(requests, tracker, head, include_usage, body.n, render)
    return EventStreamResponse(events, lambda: requests.__aexit__(None, None, None), headers)
