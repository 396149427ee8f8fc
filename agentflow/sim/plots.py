"""Plots people read: SLO attainment vs SLO scale, and P95 latency vs load."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentflow.plotting import finish_figure, plt


def plot_attainment(summaries: dict[str, dict[str, Any]], path: str | Path, *,
                    title: str = "") -> Path:
    fig, ax = plt.subplots(figsize=(6, 4))
    for policy, s in summaries.items():
        scales = sorted(s["slo_attainment"], key=float)
        ax.plot([float(x) for x in scales], [s["slo_attainment"][x] for x in scales],
                marker="o", label=policy)
    ax.set_xlabel("SLO scale (x idle latency)")
    ax.set_ylabel("SLO attainment")
    ax.set_ylim(0, 1.02)
    return finish_figure(fig, ax, path, title=title)


def plot_p95_vs_rate(series: dict[str, list[tuple[float, float]]], path: str | Path, *,
                     title: str = "") -> Path:
    fig, ax = plt.subplots(figsize=(6, 4))
    for policy, points in series.items():
        points = sorted(points)
        ax.plot([r for r, _ in points], [p for _, p in points], marker="o", label=policy)
    ax.set_xlabel("arrival rate (queries/s)")
    ax.set_ylabel("P95 latency (s)")
    return finish_figure(fig, ax, path, title=title)
