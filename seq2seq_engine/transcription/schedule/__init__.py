"""Schedule: one call's windows through the engine: inputs read, requests queued and in flight, results assembled."""
