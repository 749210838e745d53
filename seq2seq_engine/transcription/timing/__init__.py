"""Timing: a window's tokens as timed segments and words (alignment pass, DTW token timing, word grouping)."""
