"""Live transcription: audio appended as it arrives, turns found by a streaming VAD, interim text agreed by two
consecutive decodes (never taken back) and one final decode per turn, all as requests of an engine its owner runs.

    session = LiveSession(LiveOptions(language="en"), LiveDecoder.for_engine(llm.llm_engine), StreamingVad())
    events = session.append(decode_pcm16(chunk, 16000))
    for request in session.take_requests():
        engine.add_request(request.request_id, request.prompt, request.params, lora_request=request.lora_request)
    ...  # when a request finishes:
    events += session.on_output(output.request_id, output.outputs[0].token_ids)
"""
from seq2seq_engine.transcription.live.agreement import LocalAgreement
from seq2seq_engine.transcription.live.decoder import LiveDecoder
from seq2seq_engine.transcription.live.events import (Cleared, Committed, Completed, Delta, LiveEvent, SpeechStarted,
                                                      SpeechStopped)
from seq2seq_engine.transcription.live.pcm import decode_pcm16
from seq2seq_engine.transcription.live.session import DecodeRequest, LiveOptions, LiveSession, TurnDetection
from seq2seq_engine.transcription.live.vad_stream import StreamingVad

__all__ = [
    "LiveSession", "LiveOptions", "TurnDetection", "DecodeRequest", "LiveDecoder", "StreamingVad", "LocalAgreement",
    "decode_pcm16", "LiveEvent", "SpeechStarted", "SpeechStopped", "Committed", "Cleared", "Delta", "Completed",
]
