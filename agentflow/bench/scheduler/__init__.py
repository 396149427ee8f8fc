"""Scheduling policies in the simulator: their latency, cost and what each part contributes."""
