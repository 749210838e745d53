"""Helpers of the browser page's tests: Debian's chromium driven by Playwright, a WAV for its fake microphone."""
from __future__ import annotations

import contextlib
import importlib.util
import os
from typing import Any, Iterator, Optional

import numpy as np
import soundfile

from seq2seq_engine.audio import load_audio

CHROMIUM = "/usr/bin/chromium"  # Debian's package (.ci/run installs it); Playwright downloads no browser here
# Headless as root (no sandbox); the fake microphone plays a file and its permission prompt is answered yes.
CHROMIUM_ARGS = ["--no-sandbox", "--use-fake-device-for-media-stream", "--use-fake-ui-for-media-stream",
                 "--autoplay-policy=no-user-gesture-required"]


def missing_browser() -> Optional[str]:
    """Why the browser tests cannot run here (None: they can)."""
    if importlib.util.find_spec("playwright") is None:
        return "the browser page tests need Playwright for Python: pip install 'playwright>=1.65' (the test extra)"
    if not os.access(CHROMIUM, os.X_OK):
        return f"the browser page tests need Debian's chromium at {CHROMIUM}: apt-get install chromium"
    return None


@contextlib.contextmanager
def chromium(microphone: str) -> Iterator[Any]:
    """Headless chromium whose microphone plays the 16-bit PCM WAV `microphone` once (then silence)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True,
            args=CHROMIUM_ARGS + [f"--use-file-for-fake-audio-capture={microphone}%noloop"])
        try:
            yield browser
        finally:
            browser.close()


def microphone_wav(clip: str, path: str, lead_s: float = 1.0, tail_s: float = 2.5) -> str:
    """The clip as a 16 kHz 16-bit PCM WAV (what chromium's fake microphone plays) between quiet room noise: the
    lead covers the page's set-up, the tail lets the server's turn detection end the turn."""
    noise = np.random.default_rng(0).standard_normal(int((lead_s + tail_s) * 16000)).astype(np.float32) * 1e-3
    lead = int(lead_s * 16000)
    samples = np.concatenate([noise[:lead], load_audio(clip), noise[lead:]])
    soundfile.write(path, samples, 16000, subtype="PCM_16")
    return path
