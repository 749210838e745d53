"""Built-in logits processors (penalties, n-gram and bad-word bans, forced/suppressed tokens, logit bias, allowed
tokens), the request's own callables and the min_tokens ban, vectorised over one step's rows."""
from seq2seq_engine.sampling.logits_processors.bad_words import tokenize_bad_words
from seq2seq_engine.sampling.logits_processors.batch import LogitsProcessorBatch
from seq2seq_engine.sampling.logits_processors.history import OutputLists, TokenHistories

__all__ = ["LogitsProcessorBatch", "OutputLists", "TokenHistories", "tokenize_bad_words"]
