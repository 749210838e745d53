"""Cache engine and model runner: turn scheduled batches into model calls."""
