"""The LiveSessions of the realtime route: one LiveDecoder per served model and one Silero model for the whole
server, shared by every socket (each socket's StreamingVad holds only its own state)."""
from __future__ import annotations

import dataclasses
import threading
from typing import Any, Dict, Optional

from seq2seq_engine.audio.silero import load_silero_vad
from seq2seq_engine.engine_port import EnginePort
from seq2seq_engine.entrypoints.openai.realtime.protocol import SessionConfig
from seq2seq_engine.transcription.live.decoder import LiveDecoder
from seq2seq_engine.transcription.live.session import LiveOptions, LiveSession, TurnDetection
from seq2seq_engine.transcription.live.vad_stream import StreamingVad


class LiveSessions:
    """Builds the LiveSession of a socket's configuration on a served model; ValueError naming the field for a
    configuration the model cannot run (a language it does not know, none for a multilingual model)."""

    def __init__(self, **options: Any) -> None:
        self.options = options  # further LiveOptions fields (interim_interval_s, max_buffered_s)
        self._decoders: Dict[int, LiveDecoder] = {}
        self._vad_model: Optional[Any] = None
        self._lock = threading.Lock()

    @staticmethod
    def max_buffered_s() -> float:
        return LiveOptions().max_buffered_s

    def __call__(self, state: Any, config: SessionConfig, session_id: str) -> LiveSession:
        decoder = self._decoder(state.engine)
        turn = config.turn_detection
        detection = None if turn is None else TurnDetection(**dataclasses.asdict(turn))
        options = LiveOptions(language=config.language, prompt=config.prompt, turn_detection=detection, **self.options)
        vad = None if detection is None else StreamingVad(self._vad())
        return LiveSession(options, decoder, vad, session_id)

    def _decoder(self, engine: EnginePort) -> LiveDecoder:
        with self._lock:
            if id(engine) not in self._decoders:
                self._decoders[id(engine)] = LiveDecoder.for_engine(engine)
            return self._decoders[id(engine)]

    def _vad(self) -> Any:
        with self._lock:
            if self._vad_model is None:
                self._vad_model = load_silero_vad()
            return self._vad_model
