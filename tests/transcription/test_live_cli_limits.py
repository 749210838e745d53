"""`seq2seq-engine transcribe - --live` in a subprocess, as a hostile or careless pipeline drives it: random bytes
written for 20 s as fast as the pipe takes them (memory stays flat, the writer is held back, and the command ends
soon after its input), stdout closed by its reader (exit 141, no traceback) and stdin closed at start (a usage
error)."""
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from conftest import require_model, require_speech_clips

from seq2seq_engine.audio import load_audio

SR = 16000


def command(*args):
    return [os.path.join(os.path.dirname(sys.executable), "seq2seq-engine"), "transcribe", "-", "--live", *args,
            "--model", require_model("whisper-tiny.en"), "--kv-cache-space-gb", "0.2", "--swap-space-gb", "0.01"]


def rss_mb(pid):
    """The process's resident memory in MB, or None once it has exited (a zombie's status has no VmRSS line)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            line = next((line for line in status if line.startswith("VmRSS:")), None)
    except FileNotFoundError:
        return None
    return None if line is None else int(line.split()[1]) / 1024


def _write_random(process, seconds, written):
    """Random bytes into the command's stdin as fast as the pipe takes them, for `seconds`; then close it."""
    rng = np.random.default_rng(0)
    piece = rng.integers(0, 256, 1 << 16, dtype=np.uint8).tobytes()
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            process.stdin.write(piece)
            written[0] += len(piece)
        process.stdin.close()
    except (BrokenPipeError, ValueError):
        pass


def test_input_faster_than_real_time_is_held_back_and_memory_stays_flat(tmp_path):
    log = open(tmp_path / "stderr.txt", "w+b")
    process = subprocess.Popen(command(), stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=log,
                               env=dict(os.environ, OMP_NUM_THREADS="1"))
    written = [0]
    writer = threading.Thread(target=_write_random, args=(process, 20.0, written), daemon=True)
    writer.start()
    samples = []
    try:
        while writer.is_alive() and process.poll() is None:
            time.sleep(1.0)
            rss = rss_mb(process.pid)
            if rss is not None:  # the command may end between the checks above and this read
                samples.append(rss)
        closed = time.monotonic()
        process.wait(timeout=120)
    finally:
        process.kill()
    log.seek(0)
    assert process.returncode == 0, log.read().decode()[-2000:]
    assert time.monotonic() - closed < 60  # no backlog of what was written to work through
    settled = samples[len(samples) // 3:]  # after the model loaded
    assert max(settled) - min(settled) < 150, samples
    # held back: the pipe took about what was transcribed, not the hundreds of MB/s random bytes come at
    assert written[0] / 2 / SR < 2 * 3600, written[0]


def _speech_bytes():
    clip = load_audio(os.path.join(require_speech_clips(), "en", "quick_brown_fox.wav"))
    gap = np.zeros(int(1.2 * SR), dtype=np.float32)
    audio = np.concatenate([gap, clip, gap, clip, gap, clip, gap])
    return (np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes()


def test_a_closed_stdout_ends_the_command_quietly_with_141():
    read_end, write_end = os.pipe()
    os.close(read_end)  # nobody reads what it prints (as `| head -0` would leave it)
    process = subprocess.Popen(command(), stdin=subprocess.PIPE, stdout=write_end, stderr=subprocess.PIPE,
                               env=dict(os.environ, OMP_NUM_THREADS="1"))
    os.close(write_end)
    _, err = process.communicate(_speech_bytes(), timeout=300)
    assert process.returncode == 141, err.decode()[-2000:]
    assert b"Traceback" not in err and b"BrokenPipeError" not in err, err.decode()[-2000:]


def test_a_closed_stdin_is_a_usage_error():
    result = subprocess.run(["bash", "-c", 'exec "$@" <&-', "bash", *command()], capture_output=True,
                            timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert result.returncode == 2, result.stderr.decode()[-2000:]
    assert b"stdin is closed" in result.stderr and b"Traceback" not in result.stderr


@pytest.mark.parametrize("flag", ["--sample-rate", "--input-format"])
def test_live_flags_still_parse(flag):
    value = "16000" if flag == "--sample-rate" else "s16le"
    result = subprocess.run(command(flag, value, "--output-format", "srt"), capture_output=True, timeout=300)
    assert result.returncode == 2 and b"--output-format" in result.stderr
