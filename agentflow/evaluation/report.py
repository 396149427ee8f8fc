"""``summary.json``, ``report.md`` and the PNG plots of one evaluation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from agentflow.evaluation.scoring import level_key
from agentflow.metrics import Outcome, completed_latencies, scale_key


# ------------------------------------------------------------------------------ formatting
def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}%"


def _acc(a: dict[str, Any], bird: bool = False) -> str:
    if not a or a.get("accuracy") is None:
        return "n/a"
    k = "correct_bird" if bird else "correct"
    return f"{_pct(a['accuracy_bird' if bird else 'accuracy'])} ({a[k]}/{a['n']})"


def _s(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"


def _num(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def _table(header: list[str], rows: list[list[str]], align_first_left: bool = True) -> str:
    out = ["| " + " | ".join(header) + " |",
           "|" + "|".join([":---" if (i == 0 and align_first_left) else "---:"
                           for i in range(len(header))]) + "|"]
    out += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(out)


# ------------------------------------------------------------------------------ writing
def write_summary(path: Path, summary: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary, indent=2, default=str) + "\n")
    return path


def write_report(path: Path, summary: dict[str, Any], plots: dict[str, str]) -> Path:
    runs: dict[str, dict[str, Any]] = summary["runs"]
    keys = list(runs)
    ds = summary["dataset"]
    st = summary["settings"]
    lines: list[str] = []
    title = "demo" if ds["kind"] == "demo" else f"{ds['kind']} {ds['root']}"
    lines.append(f"# agentflow eval — {title} ({ds['split']})")
    lines.append("")
    lines.append(f"**Mode: {summary['mode']}.** " + summary["measured"]["statement"])
    lines.append("")
    for what, how in summary["measured"]["items"].items():
        lines.append(f"- **{what}**: {how}")
    lines.append("")
    lines.append(f"Questions: {ds['questions']} ({_sample_text(st)}). "
                 f"Arrivals: {st['arrivals']}. Pipelines: {', '.join(st['pipelines'])}; "
                 f"policies: {', '.join(st['policies'])}.")
    if st.get("instances"):
        lines.append(f"Instances: {st['instances']}.")
    lines.append("")
    lines.append(f"*Idle latency* (the base of SLO attainment): {summary['idle_latency']}")
    lines.append("")
    scale = st["slo_scale"]

    lines.append("## Overview")
    lines.append("")
    header = ["run", "questions", "EX Spider rule", "EX BIRD rule", "mean s", "P50 s", "P95 s",
              "P99 s", "queries/s", f"SLO @{scale:g}x", "LLM calls/q", "tokens in/q",
              "tokens out/q"]
    rows = []
    for k in keys:
        r = runs[k]
        lat, use = r["latency_s"], r["usage_per_question"]
        rows.append([k, str(r["questions"]), _acc(r["accuracy"]), _acc(r["accuracy"], True),
                     _s(lat["mean"]), _s(lat["p50"]), _s(lat["p95"]), _s(lat["p99"]),
                     _num(r["throughput_qps"], 3), _pct(r["slo_attainment"].get(scale_key(scale))),
                     _num(use["calls"]), _num(use["prompt_tokens"], 0),
                     _num(use["completion_tokens"], 0)])
    lines.append(_table(header, rows))
    lines.append("")
    by_note: dict[str, list[str]] = {}
    for k, r in runs.items():
        if r.get("note"):
            by_note.setdefault(r["note"], []).append(k)
    for note, ks in by_note.items():
        lines.append(f"- {', '.join(ks)}: {note}")
    if by_note:
        lines.append("")
    caveat = sequential_caveat(summary)
    if caveat:
        lines.append(f"> {caveat}")
        lines.append("")

    lines.append(f"## Accuracy by difficulty (Spider rule; {_level_source(runs)})")
    lines.append("")
    levels = sorted({lv for r in runs.values() for lv in r["by_difficulty"]}, key=level_key)
    rows = []
    for lv in levels:
        n = max(runs[k]["by_difficulty"].get(lv, {}).get("n", 0) for k in keys)
        rows.append([lv, str(n)] + [_acc(runs[k]["by_difficulty"].get(lv, {})) for k in keys])
    lines.append(_table(["difficulty", "n", *keys], rows))
    lines.append("")

    lines.append("## Accuracy by database (Spider rule)")
    lines.append("")
    dbs = sorted({d for r in runs.values() for d in r["by_database"]})
    rows = [[d, str(max(runs[k]["by_database"].get(d, {}).get("n", 0) for k in keys))]
            + [_acc(runs[k]["by_database"].get(d, {})) for k in keys] for d in dbs]
    lines.append(_table(["database", "n", *keys], rows))
    lines.append("")

    lines.append("## Outcome of each question (Spider rule)")
    lines.append("")
    reasons = [x for x in next(iter(runs.values()))["accuracy"]["by_reason"]
               if any(runs[k]["accuracy"]["by_reason"].get(x) for k in keys)]
    statuses = sorted({s for r in runs.values() for s in r["status"]})
    rows = [[f"status: {s}"] + [str(runs[k]["status"].get(s, 0)) for k in keys] for s in statuses]
    rows += [[f"verdict: {x}"] + [str(runs[k]["accuracy"]["by_reason"].get(x, 0)) for k in keys]
             for x in reasons]
    lines.append(_table(["", *keys], rows))
    lines.append("")

    lines.append("## SLO attainment vs SLO scale")
    lines.append("")
    lines.append("Share of all questions answered (status done) within scale × their idle "
                 "latency. Failed, cancelled and rejected questions count in the total and "
                 "never meet it (``agentflow.metrics``).")
    lines.append("")
    scales = list(next(iter(runs.values()))["slo_attainment"])
    rows = [[f"{s}x"] + [_pct(runs[k]["slo_attainment"].get(s)) for k in keys] for s in scales]
    lines.append(_table(["scale", *keys], rows))
    absolute = {k: r["slo_absolute"] for k, r in runs.items() if r.get("slo_absolute")}
    if absolute:
        lines.append("")
        label = "the deadline each query was given (scale × idle latency)" \
            if summary["mode"] == "simulated" else "the absolute SLO each question was given"
        lines.append(f"Met {label}: " + "; ".join(
            f"{k} {_pct(a['attainment'])} ({a['met']}/{a['n']})" for k, a in absolute.items()))
    lines.append("")

    lines.append("## Latency per stage")
    lines.append("")
    wait_word = "wait" if summary["mode"] == "simulated" else "queue"
    lines.append("Each cell: P50 / P95 seconds of one stage node (a stage type can run several "
                 f"times per question), then mean run + {wait_word} seconds.")
    lines.append("")
    stages = []
    for r in runs.values():
        for s in r["stages"]:
            if s not in stages:
                stages.append(s)
    rows = []
    for s in stages:
        row = [s]
        for k in keys:
            x = runs[k]["stages"].get(s)
            row.append("–" if x is None else
                       f"{_s(x['duration_s']['p50'])} / {_s(x['duration_s']['p95'])} "
                       f"(run {_s(x['run_s_mean'])} + {wait_word} {_s(x['queue_s_mean'])}) "
                       f"×{_num(x['per_question'])}")
        rows.append(row)
    lines.append(_table(["stage", *keys], rows))
    lines.append("")

    lines.append("## Where the time goes (mean per question, seconds)")
    lines.append("")
    if summary["mode"] == "real":
        lines.append("Sums over a question's stages (parallel stages add up, so they can exceed "
                     "the end-to-end time): run = LLM calls on an instance and tool steps; "
                     "queue = LLM calls waiting for an instance.")
    else:
        lines.append("Sums over a question's stages (parallel stages add up): alone = each "
                     "stage's time alone on an idle cluster; wait = the rest of its simulated "
                     "time (queueing and batching slowdown).")
    lines.append("")
    rows = [[k, _s(r["latency_s"]["mean"]), _s(r["idle_latency_s"]["mean"]),
             _s(r["run_s_per_question"]["mean"]), _s(r["queue_s_per_question"]["mean"]),
             _num(r["serving_span_s"], 2)] for k, r in runs.items()]
    run_label = "run s (sum)" if summary["mode"] == "real" else "alone s (sum)"
    wait_label = "queue s (sum)" if summary["mode"] == "real" else "wait s (sum)"
    lines.append(_table(["run", "end to end", "idle latency", run_label, wait_label,
                         "serving span s"], rows))
    lines.append("")

    if plots:
        lines.append("## Plots")
        lines.append("")
        for name, rel in plots.items():
            lines.append(f"![{name}]({rel})")
            lines.append("")
    lines.append("## Files")
    lines.append("")
    for what, where in summary["files"].items():
        lines.append(f"- {what}: `{where}`")
    lines.append("")
    path.write_text("\n".join(lines))
    return path


def sequential_caveat(summary: dict[str, Any]) -> str | None:
    """Without ``--rate`` a real run asks one question at a time: nothing ever waits behind
    another query, so a scheduling policy has nothing to decide and differences in latency
    between policies are machine noise. Say so wherever they are compared."""
    st = summary.get("settings", {})
    if summary.get("mode") != "real" or st.get("rate") is not None \
            or str(st.get("arrival") or "").startswith("steps:"):
        return None
    many = len(st.get("policies") or []) > 1
    return ("Questions ran one at a time (no --rate): no query ever waited behind another, "
            "so the scheduling policies had nothing to decide" + (
                " and their latencies cannot differ except by machine noise" if many else "")
            + ". Use --rate QPS (or --cluster to simulate) to compare policies under load.")


def _sample_text(st: dict[str, Any]) -> str:
    if st.get("limit"):
        return f"a seeded sample of {st['limit']}, seed {st['seed']}"
    return "every recorded question" if st.get("cluster") else "all of the split"


def _level_source(runs: dict[str, Any]) -> str:
    sources = {s for r in runs.values() for s in r.get("difficulty_sources", [])}
    return ", ".join(sorted(sources)) or "no labels"


# ------------------------------------------------------------------------------ plots
def write_plots(folder: Path, summary: dict[str, Any],
                records: dict[str, list[dict[str, Any]]]) -> dict[str, str]:
    from agentflow.plotting import finish_figure, plt

    folder.mkdir(parents=True, exist_ok=True)
    runs = summary["runs"]
    mode = summary["mode"]
    made: dict[str, str] = {}

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for key, r in runs.items():
        xs = [float(s) for s in r["slo_curve"]]
        ax.plot(xs, [r["slo_curve"][s] or 0.0 for s in r["slo_curve"]], label=key)
    ax.set_xlabel("SLO scale (x idle latency)")
    ax.set_ylabel("SLO attainment")
    ax.set_ylim(0, 1.02)
    finish_figure(fig, ax, folder / "slo_attainment.png", title=f"SLO attainment ({mode})",
                  dpi=110, legend_fontsize=8)
    made["SLO attainment vs SLO scale"] = "plots/slo_attainment.png"

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for key, recs in records.items():
        lat = np.sort(completed_latencies([Outcome.of(r) for r in recs]))  # answered ones
        if len(lat):
            ax.step(lat, np.arange(1, len(lat) + 1) / len(lat), where="post", label=key)
    ax.set_xlabel("end-to-end latency (s)")
    ax.set_ylabel("share of answered questions")
    ax.set_ylim(0, 1.02)
    finish_figure(fig, ax, folder / "latency_cdf.png", title=f"Latency CDF ({mode})", dpi=110,
                  legend_fontsize=8)
    made["Latency CDF"] = "plots/latency_cdf.png"

    stages: list[str] = []
    for r in runs.values():
        stages += [s for s in r["stages"] if s not in stages]
    fig, ax = plt.subplots(figsize=(max(6.5, 1.1 * len(stages) + 2), 4))
    width = 0.8 / max(1, len(runs))
    x = np.arange(len(stages))
    for i, (key, r) in enumerate(runs.items()):
        run = [r["stages"].get(s, {}).get("run_s_mean", 0.0) for s in stages]
        wait = [r["stages"].get(s, {}).get("queue_s_mean", 0.0) for s in stages]
        other = [max(0.0, (r["stages"].get(s, {}).get("duration_s", {}).get("mean") or 0.0)
                     - a - b) for s, a, b in zip(stages, run, wait)]
        pos = x + (i - (len(runs) - 1) / 2) * width
        bars = ax.bar(pos, run, width, label=f"{key}: run")
        color = bars.patches[0].get_facecolor() if bars.patches else None
        ax.bar(pos, wait, width, bottom=run, color=color, alpha=0.45, hatch="//",
               label=f"{key}: {'wait' if mode == 'simulated' else 'queue'}")
        ax.bar(pos, other, width, bottom=np.add(run, wait), color=color, alpha=0.2)
    ax.set_xticks(x)
    ax.set_xticklabels(stages, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("mean seconds per stage node")
    finish_figure(fig, ax, folder / "stage_breakdown.png",
                  title=f"Per-stage time ({mode}; faint: prompt building and other overhead)",
                  dpi=110, grid_axis="y", legend_fontsize=7, legend_outside=True)
    made["Per-stage breakdown"] = "plots/stage_breakdown.png"

    levels = sorted({lv for r in runs.values() for lv in r["by_difficulty"]}, key=level_key)
    if levels:
        _accuracy_bars(folder / "accuracy_by_difficulty.png", runs, "by_difficulty", levels,
                       f"Execution accuracy by difficulty (Spider rule; {mode})")
        made["Accuracy by difficulty"] = "plots/accuracy_by_difficulty.png"
    dbs = sorted({d for r in runs.values() for d in r["by_database"]})
    if dbs:
        _accuracy_bars(folder / "accuracy_by_database.png", runs, "by_database", dbs,
                       f"Execution accuracy by database (Spider rule; {mode})")
        made["Accuracy by database"] = "plots/accuracy_by_database.png"
    return made


def _accuracy_bars(path: Path, runs: dict[str, Any], field: str, groups: list[str],
                   title: str) -> None:
    """Grouped bars: one group per difficulty level (or database), one bar per run, each
    labelled with its n; the legend sits outside the bars."""
    from agentflow.plotting import finish_figure, plt

    fig, ax = plt.subplots(figsize=(max(6.5, 0.9 * len(groups) * max(1, len(runs)) / 2 + 3),
                                    4))
    width = 0.8 / max(1, len(runs))
    x = np.arange(len(groups))
    for i, (key, r) in enumerate(runs.items()):
        cells = [r[field].get(g, {}) for g in groups]
        values = [c.get("accuracy") or 0.0 for c in cells]
        pos = x + (i - (len(runs) - 1) / 2) * width
        bars = ax.bar(pos, values, width, label=key)
        # every bar says its value: a 0% bar has no height, and an empty plot reads as broken
        ax.bar_label(bars, labels=[f"{100 * v:.0f}%" if c.get("n") else "n/a"
                                   for v, c in zip(values, cells)], fontsize=7, padding=1)
    ax.set_xticks(x)
    ns = [max(r[field].get(g, {}).get("n", 0) for r in runs.values()) for g in groups]
    ax.set_xticklabels([f"{g}\n(n={n})" for g, n in zip(groups, ns)],
                       rotation=30 if len(groups) > 6 else 0,
                       ha="right" if len(groups) > 6 else "center", fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("execution accuracy")
    finish_figure(fig, ax, path, title=title, dpi=110, grid_axis="y", legend_fontsize=8,
                  legend_outside=True)
