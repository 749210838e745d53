"""A scripted VAD and a stand-in decoder for LiveSession's unit tests: speech probability per frame from a script,
requests that carry their samples and prompt, answered with the text a test wants."""
import numpy as np

from seq2seq_engine.transcription.live import DecodeRequest

SR, FRAME = 16000, 512


class ScriptedVad:
    """Speech probability per frame from a script (frames past its end: 0)."""

    frame_samples = FRAME

    def __init__(self, script):
        self.script, self.frames_done, self.pending = list(script), 0, 0

    def feed(self, samples):
        self.pending += len(samples)
        count, self.pending = self.pending // FRAME, self.pending % FRAME
        out = [self.script[k] if k < len(self.script) else 0.0
               for k in range(self.frames_done, self.frames_done + count)]
        self.frames_done += count
        return np.array(out, dtype=np.float32)


class TextDecoder:
    """Requests carry their samples and prompt; the test answers each with the text it wants (tokens = bytes)."""

    needs_language = False

    def check_language(self, language):
        return language

    def request(self, request_id, samples, language, prompt_text, interim=False, prefix_text=None):
        prompt = {"samples": samples, "prompt_text": prompt_text, "interim": interim, "prefix_text": prefix_text}
        return DecodeRequest(request_id, prompt, None)

    def text(self, token_ids, prefix_text=None):
        return " ".join(filter(None, [prefix_text, bytes(token_ids).decode()]))

    def usable_interim(self, text):
        return True


def answer(session, request, text):
    return session.on_output(request.request_id, list(text.encode()))


def frames(*runs):
    """A script from (probability, seconds) runs."""
    return [p for p, seconds in runs for _ in range(round(seconds * SR / FRAME))]


def feed(session, audio, seconds, start=0.0, chunk=640):
    events, first, last = [], int(start * SR), int((start + seconds) * SR)
    for pos in range(first, last, chunk):
        events += session.append(audio[pos:min(pos + chunk, last)])
    return events
