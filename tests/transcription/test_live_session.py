"""LiveSession end to end on the real whisper-tiny.en engine and the real Silero VAD: speech clips (pytest-audioeval)
joined with pauses, fed in 20-100 ms chunks faster than real time while the test steps the engine as an owner
would. One Completed per spoken turn, each the text `llm.transcribe` gives for the turn's span, deltas that
concatenate to a prefix of it, and every KV block back in the pool afterwards; a 36 s turn rolls over."""
import os
import re

import jiwer
import numpy as np
import pytest
from conftest import require_speech_clips

from seq2seq_engine.audio import load_audio
from seq2seq_engine.entrypoints.live_cli import run_requests
from seq2seq_engine.transcription.live import (Committed, Completed, Delta, LiveDecoder, LiveOptions, LiveSession,
                                               SpeechStarted, SpeechStopped, TurnDetection)

pytestmark = pytest.mark.usefixtures("one_thread", "no_leaked_blocks")
SR = 16000
NAMES = ("counting.wav", "quick_brown_fox.wav", "hello_world.wav")
WER = 0.1  # a turn's words (lowercase, without punctuation) against `transcribe`'s of its span


def clip(name):
    return load_audio(os.path.join(require_speech_clips(), "en", name))


def pause(seconds, seed):
    return 0.003 * np.random.default_rng(seed).standard_normal(int(seconds * SR))


def words(text):
    return re.sub(r"[^a-z0-9' ]", " ", text.lower()).split()


def stream(llm, audio, options, seed=0, out=None):
    """All events of `audio` fed in 20-100 ms chunks, one engine step per chunk, then the engine run dry."""
    engine = llm.llm_engine
    session = LiveSession(options, LiveDecoder.for_engine(engine))
    if out is not None:
        out.append(session)
    rng, events, pos = np.random.default_rng(seed), [], 0
    while pos < len(audio):
        size = int(rng.integers(20, 101)) * SR // 1000
        events += session.append(audio[pos:pos + size])
        pos += size
        run_requests(engine, session, events)
    while True:  # on_output can queue requests too (a window whose prompt was the one before)
        run_requests(engine, session, events)
        if not engine.has_unfinished_requests() and not session.pending_request_ids():
            break
    assert session.take_requests() == []
    return events


def check_items(events, prefix=True):
    """Per item (in commit order): its events' kinds in order, the deltas concatenated (a prefix of the transcript
    unless `prefix` is False), the transcript."""
    items = {}
    for event in events:
        items.setdefault(getattr(event, "item_id", None), []).append(event)
    out = []
    for item, own in items.items():
        kinds = [type(e) for e in own]
        assert kinds.count(Completed) == 1 and kinds[-1] is Completed, kinds
        sent = "".join(e.text for e in own if isinstance(e, Delta))
        transcript = own[-1].transcript
        assert transcript.startswith(sent) or not prefix, (sent, transcript)
        out.append((own, sent, transcript))
    return out


def test_three_spoken_turns_give_the_transcribe_text_of_their_spans(tiny_llm):
    parts = [pause(1.0, 0)]
    for k, name in enumerate(NAMES):
        parts += [clip(name), pause(1.2, k + 1)]
    audio = np.concatenate(parts).astype(np.float32)
    # the final decode of each turn starts when it ends (no speculative decode): its span is known exactly
    events = stream(tiny_llm, audio, LiveOptions(interim_interval_s=0.5, speculative_silence_ms=None))
    items = check_items(events)
    assert len(items) == 3
    interim_deltas = 0
    for own, sent, transcript in items:
        started, stopped = own[0], next(e for e in own if isinstance(e, SpeechStopped))
        assert isinstance(started, SpeechStarted) and any(isinstance(e, Committed) for e in own)
        span = audio[started.audio_start_ms * SR // 1000:stopped.audio_end_ms * SR // 1000]
        [expected] = tiny_llm.transcribe([span], temperature=0.0, beam_width=1, use_tqdm=False)
        assert sent == transcript  # the normal case: the last delta completes the text
        commit = next(i for i, e in enumerate(own) if isinstance(e, Committed))
        early = [e for e in own[:commit] if isinstance(e, Delta)]
        interim_deltas += len(early)
        if not early:  # nothing to continue: the plain greedy decode of the span
            assert transcript == expected.text.strip()
        else:  # it continues the deltas, which may differ from the plain decode in case and punctuation
            assert jiwer.wer(" ".join(words(expected.text)), " ".join(words(transcript))) <= WER
    assert interim_deltas >= 1  # text agreed while the turn was spoken
    reference = " ".join(open(os.path.join(require_speech_clips(), "en", n[:-4] + ".txt")).read() for n in NAMES[1:])
    assert jiwer.wer(" ".join(words(reference)), " ".join(words(" ".join(t for _, _, t in items[1:])))) < 0.1


def test_speculative_final_decodes_keep_the_words(tiny_llm):
    """With the default speculative decode (started 160 ms into each silence, kept when the silence lasts) the turns
    read as the reference text, and deltas still prefix each transcript."""
    parts = [pause(1.0, 0)]
    for k, name in enumerate(NAMES):
        parts += [clip(name), pause(1.2, k + 1)]
    audio = np.concatenate(parts).astype(np.float32)
    items = check_items(stream(tiny_llm, audio, LiveOptions(interim_interval_s=0.5)))
    assert len(items) == 3 and all(sent == transcript for _, sent, transcript in items)
    reference = " ".join(open(os.path.join(require_speech_clips(), "en", n[:-4] + ".txt")).read() for n in NAMES[1:])
    assert jiwer.wer(" ".join(words(reference)), " ".join(words(" ".join(t for _, _, t in items[1:])))) < 0.1


def test_a_turn_longer_than_a_window_rolls_over_and_keeps_its_words(tiny_llm):
    speech = []
    for k in range(4):
        for name in NAMES:
            speech += [clip(name), pause(0.2, 10 * k + len(speech))]
    audio = np.concatenate([pause(0.5, 99)] + speech + [pause(2.0, 98)]).astype(np.float32)
    assert len(audio) > 31 * SR
    # the clips hold pauses of their own: a long silence_duration_ms keeps them in one turn
    options = LiveOptions(interim_interval_s=3.0, turn_detection=TurnDetection(silence_duration_ms=1500))
    events = stream(tiny_llm, audio, options)
    # The first interim decodes (a few seconds of audio) write the numbers "1-2-3-...", the longer ones "1 2 3 ...":
    # the delta sent early is not where the final text starts, and the transcript is the final text regardless.
    [(own, sent, transcript)] = check_items(events, prefix=False)
    started, stopped = own[0], next(e for e in own if isinstance(e, SpeechStopped))
    span = audio[started.audio_start_ms * SR // 1000:stopped.audio_end_ms * SR // 1000]
    [expected] = tiny_llm.transcribe([span], temperature=0.0, beam_width=1, vad_filter=False,
                                     condition_on_previous_text=True, use_tqdm=False)
    # both cut the turn at 30 s; the second window's prompt is the first one's text here, its tokens there
    assert jiwer.wer(" ".join(words(expected.text)), " ".join(words(transcript))) <= 0.1
    assert len(words(transcript)) >= 60


def test_a_multilingual_model_without_a_language_detects_it_on_the_first_speech():
    from conftest import require_model

    from seq2seq_engine import LLM
    llm = LLM(require_model("whisper-base"), kv_cache_space_gb=0.2, swap_space_gb=0.01)
    audio = np.concatenate([pause(0.8, 5), clip("quick_brown_fox.wav"), pause(1.0, 6)]).astype(np.float32)
    sessions = []
    events = stream(llm, audio, LiveOptions(interim_interval_s=1.0), out=sessions)
    assert sessions[0].language == "en"
    [(own, sent, transcript)] = check_items(events)
    started, stopped = own[0], next(e for e in own if isinstance(e, SpeechStopped))
    span = audio[started.audio_start_ms * SR // 1000:stopped.audio_end_ms * SR // 1000]
    [expected] = llm.transcribe([span], temperature=0.0, beam_width=1, use_tqdm=False)
    assert expected.language == "en"
    assert jiwer.wer(" ".join(words(expected.text)), " ".join(words(transcript))) <= WER
    engine = llm.llm_engine
    assert engine.scheduler.block_manager.get_num_free_gpu_blocks() == engine.cache_config.num_gpu_blocks
