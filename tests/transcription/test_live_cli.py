"""`seq2seq-engine transcribe - --live` in a subprocess: real speech piped as raw s16le (16 kHz, and 24 kHz that it
resamples) or in a container (Ogg Opus) prints one line per spoken turn, each the clip's words; flags it does not
take are usage errors."""
import os
import re
import subprocess
import sys

import jiwer
import numpy as np
import pytest
from av_media import encode
from conftest import require_model, require_speech_clips

from seq2seq_engine.audio import load_audio, resample

NAMES = ("counting", "quick_brown_fox", "hello_world")
SR = 16000


NUMBERS = "zero one two three four five six seven eight nine ten".split()


def words(text):
    """Lowercase words without punctuation, numbers 0-10 spelled out (Whisper writes "1-2-3", the clip "One two")."""
    out = re.sub(r"[^a-z0-9' ]", " ", text.lower().replace("-", " ")).split()
    return " ".join(NUMBERS[int(w)] if w.isdigit() and int(w) <= 10 else w for w in out)


def command(*args):
    return [os.path.join(os.path.dirname(sys.executable), "seq2seq-engine"), "transcribe", *args,
            "--kv-cache-space-gb", "0.2", "--swap-space-gb", "0.01"]


@pytest.fixture(scope="module")
def speech():
    folder = os.path.join(require_speech_clips(), "en")
    rng = np.random.default_rng(0)
    parts, texts = [0.003 * rng.standard_normal(SR)], []
    for name in NAMES:
        parts += [load_audio(os.path.join(folder, name + ".wav")), 0.003 * rng.standard_normal(int(1.2 * SR))]
        texts.append(open(os.path.join(folder, name + ".txt"), encoding="utf-8").read())
    return np.concatenate(parts).astype(np.float32), texts


@pytest.mark.parametrize("rate", [16000, 24000, "ogg"])
def test_piped_speech_prints_one_line_per_turn(speech, rate, tmp_path):
    audio, texts = speech
    if rate == "ogg":  # a container (Opus in Ogg), recognised by its first bytes and decoded as it arrives
        with open(encode(tmp_path / "speech.ogg", audio, SR, "ogg"), "rb") as handle:
            data, flags = handle.read(), []
    else:
        audio = resample(audio, SR, rate) if rate != SR else audio
        data, flags = (np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes(), ["--sample-rate", str(rate)]
    process = subprocess.Popen(command("-", "--live", *flags, "--model", require_model("whisper-tiny.en")),
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               env=dict(os.environ, OMP_NUM_THREADS="1"))
    out, err = process.communicate(data, timeout=300)
    assert process.returncode == 0, err.decode()[-2000:]
    lines = out.decode().splitlines()
    assert len(lines) == len(texts), lines
    for line, text in zip(lines, texts):
        assert jiwer.wer(words(text), words(line)) <= 0.1, (line, text)


def test_live_takes_only_stdin_and_text_lines():
    for args, message in [(["a.wav", "--live"], "only AUDIO"), (["-", "--live", "--sample-rate", "100"], "8000"),
                          (["-", "--live", "--output-format", "srt"], "--output-format"),
                          (["-", "--live", "--input-format", "container", "--sample-rate", "16000"], "names its own")]:
        result = subprocess.run(command(*args), capture_output=True, text=True, timeout=120)
        assert result.returncode == 2 and message in result.stderr, result.stderr
