"""The error figures real_vs_sim prints, for the simulator and for a second real run in its
place (``--repeat``), computed one way for both.

Per call, ``|pred - real| / real`` of its latency: the median; the time-weighted mean
(``sum |pred - real| / sum real``: the calls that carry the time count for their time, not
the many one-token calls whose latency is mostly a prefill); the median over calls with more
than 2 output tokens (where decode and batching physics, not a lone prefill, set the time).
Per query, the same of its end-to-end latency: the 95th percentile, which needs enough
queries to mean anything, so ``--repeat`` also pools the per-query errors of several runs.
"""

from __future__ import annotations

import numpy as np

MIN_P95_QUERIES = 30  # a P95 over fewer queries is (nearly) their maximum


def relative_errors(pred, real) -> np.ndarray:
    pred, real = np.asarray(pred, float), np.asarray(real, float)
    return np.abs(pred - real) / real


def call_figures(pred_call, real_call, outputs=None) -> dict[str, float]:
    """Median, time-weighted mean and (with ``outputs``) the median over calls of > 2 output
    tokens of the per-call errors."""
    pred, real = np.asarray(pred_call, float), np.asarray(real_call, float)
    err = relative_errors(pred, real)
    out = {"median_call_error": float(np.median(err)),
           "time_weighted_call_error": float(np.abs(pred - real).sum() / real.sum())}
    if outputs is not None:
        long_ = np.asarray(outputs) > 2
        out["median_call_error_gt2"] = float(np.median(err[long_])) if long_.any() \
            else float("nan")
    return out


def p95(errors) -> float:
    return float(np.percentile(np.asarray(errors, float), 95))
