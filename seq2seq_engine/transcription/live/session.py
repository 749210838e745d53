"""A live transcription, sans-IO: audio in, events and engine requests out; its owner runs the engine."""
from __future__ import annotations

import itertools
import uuid
from typing import List, Optional, Tuple

import numpy as np

from seq2seq_engine.audio import SAMPLE_RATE
from seq2seq_engine.transcription.live.audio_buffer import AudioBacklog, AudioBuffer, check_samples
from seq2seq_engine.transcription.live.decode_request import DecodeRequest
from seq2seq_engine.transcription.live.decoder import LiveDecoder
from seq2seq_engine.transcription.live.events import (Cleared, Committed, LiveEvent, SpeechStarted, SpeechStopped,
                                                      audio_ms, completed_events, delta_events)
from seq2seq_engine.transcription.live.options import LiveOptions, TurnDetection
from seq2seq_engine.transcription.live.request_book import DETECT, INTERIM, PART, SPECULATIVE, Pending, RequestBook
from seq2seq_engine.transcription.live.speculation import Speculation, adoptable, final_prefix
from seq2seq_engine.transcription.live.turn import Turn
from seq2seq_engine.transcription.live.vad_stream import StreamingVad

__all__ = ["TurnDetection", "LiveOptions", "DecodeRequest", "LiveSession", "AudioBacklog"]

WINDOW_SAMPLES = 30 * SAMPLE_RATE  # a turn longer than one Whisper window rolls over to the next, at a pause
MIN_COMMIT_SAMPLES = SAMPLE_RATE // 10  # commit() of less than 100 ms of audio is refused (as OpenAI's)
SILENCE_MARGIN = 0.15  # a silence starts below threshold - 0.15 and continues below threshold (Silero's rule)


class LiveSession:
    """One live transcription. Sans-IO: `take_requests` hands out the decodes to run, `on_output` takes their
    tokens back; every method returns the events it caused, in order. A turn being spoken is decoded again every
    `interim_interval_s` (one interim decode at a time) and the words two decodes agree on go out as Deltas
    (LocalAgreement-2); one final decode, forced to continue the deltas, completes it (with server VAD it may start
    early, after `speculative_silence_ms` of silence). A turn over 30 s rolls over at a pause, the next window
    prompted with the text before; Completed events come in commit order. The owner stops feeding audio while
    `backlogged` (more final decodes than `max_decodes_in_flight` would run at once). docs/decisions.md §80.
    """

    def __init__(self, options: LiveOptions, decoder: LiveDecoder, vad: Optional[StreamingVad] = None,
                 session_id: Optional[str] = None) -> None:
        if not isinstance(options, LiveOptions):
            raise TypeError(f"options must be a LiveOptions, got {type(options).__name__}")
        self.options, self.decoder = options, decoder
        self.language = decoder.check_language(options.language)
        if options.turn_detection is not None and vad is None:
            vad = StreamingVad()
        self.vad = vad if options.turn_detection is not None else None
        self.session_id = session_id or uuid.uuid4().hex[:12]
        self._audio = AudioBuffer()
        self._turns: List[Turn] = []  # committed turns not completed yet, then the turn being spoken
        self._current: Optional[Turn] = None
        self._last_item: Optional[str] = None
        self._book = RequestBook(options.max_decodes_in_flight)
        # without a language on a multilingual model: the detection request, and the part decodes held until then
        self._detecting: Optional[str] = None
        self._held: List[Tuple[Turn, int, np.ndarray, Optional[str], Optional[str]]] = []
        self._ids = itertools.count()

    # ------------------------------------------------------------------ audio in
    def append(self, samples: np.ndarray) -> List[LiveEvent]:
        """Take float32 16 kHz mono samples: VAD, turn detection, interim decodes and 30 s rollovers. AudioBacklog
        (a ValueError) while more than max_buffered_s is held: the owner waits while `backlogged`."""
        samples = check_samples(samples)
        if self.buffered_seconds > self.options.max_buffered_s:
            raise AudioBacklog(self.buffered_seconds, self.options.max_buffered_s)
        events: List[LiveEvent] = []
        if self.vad is None and self._current is None and len(samples):
            self._current = self._open(self._audio.end)
        self._audio.append(samples)
        if self.vad is None:
            if self._current is not None:
                self._roll(self._current, self._audio.end)
        else:
            first = self.vad.frames_done
            for k, prob in enumerate(self.vad.feed(samples), start=first):
                events += self._on_frame(float(prob), (k + 1) * StreamingVad.frame_samples)
            if self._current is None:
                pad = self.options.turn_detection.prefix_padding_ms * SAMPLE_RATE // 1000
                self._audio.drop_before(self.vad.frames_done * StreamingVad.frame_samples - pad)
        turn = self._current
        if turn is not None and self._audio.end - turn.part_start > self.options.max_buffered_s * SAMPLE_RATE:
            if self.vad is not None:
                events.append(SpeechStopped(turn.item_id, audio_ms(self._audio.end)))
            events += self._commit(turn, self._audio.end)
        return events

    def commit(self) -> List[LiveEvent]:
        """End the turn now (the client's commit): Committed, and its final decode is queued. ValueError when less
        than 100 ms of audio is uncommitted (with server VAD: when no speech was heard since the last turn)."""
        turn = self._current
        held = 0 if turn is None else self._audio.end - turn.start
        if held < MIN_COMMIT_SAMPLES:
            raise ValueError(f"the input audio buffer holds {held * 1000 // SAMPLE_RATE} ms of uncommitted audio; "
                             f"a commit needs at least {MIN_COMMIT_SAMPLES * 1000 // SAMPLE_RATE} ms")
        return self._commit(turn, self._audio.end)

    def clear(self) -> List[LiveEvent]:
        """Drop the uncommitted audio (the turn being spoken, its parts and interim decodes): Cleared. The VAD's
        state goes on (the stream continues); the next speech starts a new turn."""
        turn = self._current
        if turn is not None:
            turn.dropped = True
            self._turns.remove(turn)
            self._book.drop_turn(turn)
            self._current = None
        self._audio.drop_before(self._audio.end)
        return [Cleared()] + completed_events(self._turns)

    # ------------------------------------------------------------------ the owner's side
    def take_requests(self, interim: bool = True) -> List[DecodeRequest]:
        """The decodes to submit to the engine now (each once); they count as pending until on_output. Call it
        after append, commit and on_output alike: a finished window queues the next window of its turn. With
        `interim=False` (an owner whose engine is busy) a queued interim decode is dropped, not handed out: interim
        text is best effort, and the next interval's tick tries again."""
        return self._book.take(best_effort=interim)

    @property
    def interim_queued(self) -> bool:
        """Whether take_requests would hand out an interim decode now."""
        return self._book.queued(INTERIM)

    def take_stale(self) -> List[str]:
        """Submitted decodes whose output is no longer needed (a speculative decode that speech overtook, an interim
        decode that a speculative or final decode of the same audio overtook): the owner aborts them, and hands them
        to `on_output` no more."""
        return self._book.take_stale()

    def on_output(self, request_id: str, token_ids: List[int]) -> List[LiveEvent]:
        """A submitted decode finished with `token_ids`: Deltas, and Completed for a turn whose last decode it was.
        ValueError for a request id this transcription did not hand out or that finished already."""
        turn, kind, index, prefix = self._book.entry(request_id)
        self._book.forget(request_id)
        if kind == DETECT:
            return self._on_language(token_ids)
        if turn.dropped:
            return []
        text = self.decoder.text(token_ids, prefix) if prefix else self.decoder.text(token_ids)
        if kind == SPECULATIVE:
            if turn.speculative is not None and turn.speculative.request_id == request_id:
                turn.speculative.text = text  # the final part's text, should the silence last
            return []
        if kind == INTERIM:
            if turn is not self._current or index != len(turn.parts) or not self.decoder.usable_interim(text):
                return []  # the turn ended or rolled over since (its final parts decide), or a repetition loop
            words = " ".join(turn.text_before() + [text]).split()
            return delta_events(turn, turn.agreement.insert(words))
        turn.parts[index] = text
        self._start_waiting(turn)
        if turn.committed or self.vad is None:  # without VAD the item exists from its commit on
            return completed_events(self._turns)
        return delta_events(turn, turn.agreement.confirm(turn.words))

    def pending_request_ids(self) -> List[str]:
        """Requests handed out by take_requests and not finished: what to abort when the stream closes."""
        return self._book.submitted_ids()

    @property
    def backlogged(self) -> bool:
        """Whether final decodes wait for others to finish (queued beyond max_decodes_in_flight, parts waiting for
        the text before them or for the language): an owner stops feeding audio until an output comes back."""
        waiting = any(turn.waiting for turn in self._turns) or bool(self._held)
        return waiting or self._book.finals_queued > 0

    @property
    def buffered_seconds(self) -> float:
        """Seconds of audio the transcription holds: the uncommitted turn's current part (or the prefix padding
        between turns) and the parts waiting for the text before them."""
        waiting = sum(turn.waiting_samples for turn in self._turns) + sum(len(held[2]) for held in self._held)
        return (len(self._audio) + waiting) / SAMPLE_RATE

    # ------------------------------------------------------------------ turns
    def _open(self, start: int) -> Turn:
        turn = Turn(start=start)
        self._turns.append(turn)
        return turn

    def _on_frame(self, prob: float, end: int) -> List[LiveEvent]:
        """Turn detection at one VAD frame ending at sample `end`."""
        detection = self.options.turn_detection
        turn = self._current
        if turn is None:
            if prob < detection.threshold:
                return []
            pad = detection.prefix_padding_ms * SAMPLE_RATE // 1000
            self._current = turn = self._open(max(self._audio.start, end - StreamingVad.frame_samples - pad))
            return [SpeechStarted(turn.item_id, audio_ms(turn.start))]
        if prob >= detection.threshold:
            turn.silence_frames, turn.speech_in_part = 0, True
            self._drop_speculation(turn)
        elif prob < detection.threshold - SILENCE_MARGIN or turn.silence_frames:
            turn.silence_frames += 1
        silence_ms = turn.silence_frames * StreamingVad.frame_samples * 1000 // SAMPLE_RATE
        if turn.silence_frames and silence_ms >= detection.silence_duration_ms:
            return [SpeechStopped(turn.item_id, audio_ms(end))] + self._commit(turn, end)
        self._roll(turn, end)
        speculative_ms = self.options.speculative_silence_ms
        if (speculative_ms is not None and turn.silence_frames and silence_ms >= speculative_ms
                and turn.speculative is None and turn.speech_in_part and not turn.waiting and turn.parts_known()):
            self._speculate(turn, end)
        if end - turn.interim_mark >= self.options.interim_interval_s * SAMPLE_RATE:
            turn.interim_mark = end
            # no interim decode while the speculative decode of the same audio runs
            if self._book.interim is None and not turn.waiting and turn.parts_known() and turn.speculative is None:
                prompt = self._prompt_text(turn, len(turn.parts))
                self._request(turn, INTERIM, len(turn.parts), self._audio.slice(turn.part_start, end), prompt)
        return []

    def _roll(self, turn: Turn, upto: int) -> None:
        """Cut the turn's audio before `upto` into final 30 s parts, as long as whole windows of it are held."""
        while upto - turn.part_start >= WINDOW_SAMPLES:
            cut = self._audio.quiet_cut(turn.part_start, turn.part_start + WINDOW_SAMPLES)
            self._add_part(turn, self._audio.slice(turn.part_start, cut), decode=True)
            turn.part_start = cut
            self._audio.drop_before(cut)

    def _drop_speculation(self, turn: Turn) -> None:
        """Speech again: the turn's speculative decode is not its final one (queued: withdrawn; running: stale)."""
        speculation, turn.speculative = turn.speculative, None
        if speculation is not None:
            self._book.withdraw(speculation.request_id)

    def _drop_interim(self, turn: Turn) -> None:
        """The turn ended: its interim decode is not needed any more (withdrawn or stale)."""
        entry = self._book.entry_of(self._book.interim)
        if entry is not None and entry.turn is turn:
            self._book.withdraw(self._book.interim)

    def _speculate(self, turn: Turn, end: int) -> None:
        """Decode the turn's current part up to `end` as its final decode would be made now (an interim decode in
        flight goes on: should speech resume, its hypothesis still counts)."""
        index = len(turn.parts)
        prefix = final_prefix(turn, index)
        request_id = self._request(turn, SPECULATIVE, index, self._audio.slice(turn.part_start, end),
                                   self._prompt_text(turn, index), prefix)
        if request_id is not None:
            turn.speculative = Speculation(request_id, end, index, prefix)

    def _commit(self, turn: Turn, end: int) -> List[LiveEvent]:
        """The turn's audio ends at `end`: its last part is decoded (not when the VAD heard no speech in it), or is
        the speculative decode made when the silence began."""
        self._roll(turn, end)
        self._drop_interim(turn)
        in_flight = turn.speculative is not None and self._book.entry_of(turn.speculative.request_id) is not None
        speculation = adoptable(turn, in_flight)
        if speculation is not None:
            turn.parts.append(speculation.text)
            turn.speech_in_part = False
            if speculation.text is None:  # still running: its output completes the part
                self._book.retarget(speculation.request_id, Pending(turn, PART, speculation.index, speculation.prefix))
        else:
            self._drop_speculation(turn)  # a guess the turn's end does not use: withdrawn or aborted
            samples = self._audio.slice(turn.part_start, end)
            self._add_part(turn, samples, decode=len(samples) > 0 and (self.vad is None or turn.speech_in_part))
        turn.committed, turn.end = True, end
        self._audio.drop_before(end)
        self._current = None
        previous, self._last_item = self._last_item, turn.item_id
        return [Committed(turn.item_id, previous)] + completed_events(self._turns)

    def _add_part(self, turn: Turn, samples: np.ndarray, decode: bool) -> None:
        turn.parts.append(None if decode else "")
        if decode:
            turn.waiting.append((len(turn.parts) - 1, samples))
            self._start_waiting(turn)
        turn.speech_in_part = self.vad is None or turn.silence_frames == 0

    def _start_waiting(self, turn: Turn) -> None:
        """Queue the final decode of each waiting part whose prompt (the text of the parts before it) is known."""
        while turn.waiting and turn.parts_known(turn.waiting[0][0]):
            index, samples = turn.waiting.pop(0)
            self._request(turn, PART, index, samples, self._prompt_text(turn, index), final_prefix(turn, index))

    def _prompt_text(self, turn: Turn, index: int) -> Optional[str]:
        texts = ([self.options.prompt] if self.options.prompt else []) + turn.text_before(index)
        return " ".join(texts) or None

    def _request(self, turn: Turn, kind: str, index: int, samples: np.ndarray, prompt: Optional[str],
                 prefix: Optional[str] = None) -> Optional[str]:
        """Queue a decode (None: an interim decode that waits for the language is not made at all)."""
        request_id = f"live-{self.session_id}-{next(self._ids)}"
        if self.language is None and self.decoder.needs_language:
            if self._detecting is None:  # detected once, on the first speech decoded
                self._detecting = request_id
                self._book.add(self.decoder.detection_request(request_id, samples), Pending(None, DETECT, 0, None))
            if kind == PART:
                self._held.append((turn, index, samples, prompt, prefix))
            return None
        extra = {"interim": True} if kind == INTERIM else ({"prefix_text": prefix} if prefix else {})
        self._book.add(self.decoder.request(request_id, samples, self.language, prompt, **extra),
                       Pending(turn, kind, index, prefix))
        return request_id

    def _on_language(self, token_ids: List[int]) -> List[LiveEvent]:
        self.language, self._detecting = self.decoder.language_of(token_ids), None
        held, self._held = self._held, []
        for turn, index, samples, prompt, prefix in held:
            if not turn.dropped:
                self._request(turn, PART, index, samples, prompt, prefix)
        return []
