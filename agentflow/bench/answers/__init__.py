"""Answers: execution accuracy, confidence calibration and the effect of teaching."""
