"""The engine: builds the pieces from a model directory and runs the schedule → run → sample → output loop."""
from seq2seq_engine.engine.llm_engine import LLMEngine

__all__ = ["LLMEngine"]
