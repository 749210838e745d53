"""Each input's TranscriptionResult from its final windows: handed over as inputs finish, streamed, or at the end."""
from __future__ import annotations

from typing import Callable, Dict, List, Sequence, Tuple

from seq2seq_engine.transcription.output.results import FailureKind, Segment, TranscriptionResult
from seq2seq_engine.transcription.prompts import WhisperTokens
from seq2seq_engine.transcription.schedule.input_source import InputState
from seq2seq_engine.transcription.timing.segments import pieces_and_segments, stitch


class ResultAssembler:
    """Decides when an input is finished (every window read and final, or failed) and stitches its result
    (segments.py). `take_finished` hands over the inputs finished since the last call; with `stream`,
    `take_progress` hands over each input's leading windows as they become final."""

    def __init__(self, inputs: Sequence[InputState], tokens: WhisperTokens, decode_text: Callable[[List[int]], str],
                 timestamps: bool, stream: bool) -> None:
        self.inputs, self.tokens, self.decode_text = inputs, tokens, decode_text
        self.timestamps, self.stream = timestamps, stream
        self.newly_finished: List[InputState] = []
        self._streamed: Dict[int, Tuple[int, bool]] = {}  # input -> (its leading windows streamed, any text yet)

    def finish_if_complete(self, state: InputState) -> None:
        if not state.finished and state.all_read and len(state.window_tokens) == len(state.windows):
            state.finished = True
            self.newly_finished.append(state)

    def fail(self, state: InputState, message: str, kind: FailureKind) -> None:
        """The input is finished with `message` as its error, of `kind`."""
        state.error, state.failure = message, kind
        state.finished = True
        self.newly_finished.append(state)

    def take_finished(self) -> List[Tuple[int, TranscriptionResult]]:
        """(input index, result) of each input finished since the last call; its windows are dropped then."""
        finished = []
        while self.newly_finished:
            state = self.newly_finished.pop(0)
            finished.append((state.index, self.result(state)))
            state.window_tokens, state.windows = {}, []
        return finished

    def take_progress(self) -> List[Tuple[int, List[Segment], str]]:
        """With `stream`: (input index, segments, text) of each input's leading windows that became final since the
        last call, in time order; an input's texts joined are its result's text. Call it before take_finished."""
        progress: List[Tuple[int, List[Segment], str]] = []
        for state in self.inputs if self.stream else []:
            first, started = self._streamed.get(state.index, (0, False))
            last = first
            while state.error is None and last in state.window_tokens:
                last += 1
            if last == first:
                continue
            windows = [state.window_tokens[k] for k in range(first, last)]
            pieces, segments = pieces_and_segments(windows, self.tokens, self.decode_text, self.timestamps)
            text = "".join(pieces) if started else "".join(pieces).lstrip()
            self._streamed[state.index] = (last, started or bool(text))
            if text or segments:
                progress.append((state.index, segments, text))
        return progress

    def results(self) -> List[TranscriptionResult]:
        """Every input's result, in input order (once all are finished)."""
        return [self.result(state) for state in self.inputs]

    def result(self, state: InputState) -> TranscriptionResult:
        if state.error is not None:
            return TranscriptionResult("", state.language, [], state.error, state.duration,
                                       state.language_probability, state.name, state.failure)
        windows = [state.window_tokens[k] for k in sorted(state.window_tokens)]
        text, segments = stitch(windows, self.tokens, self.decode_text, self.timestamps)
        return TranscriptionResult(text, state.language, segments, None, state.duration, state.language_probability,
                                   state.name)
