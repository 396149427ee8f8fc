"""``run_eval``: the one entry point behind ``agentflow eval``."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from agentflow.accuracy.official import rules_note
from agentflow.config import AgentFlowConfig
from agentflow.evaluation.records import Judge, RecordStore
from agentflow.evaluation.report import write_plots, write_report, write_summary
from agentflow.evaluation.scoring import summarize_run
from agentflow.evaluation.spec import (
    DatasetSpec,
    EvalError,
    check_pipelines,
    check_policies,
    load_spec,
    parse_dataset_spec,
    run_key,
    sample_examples,
    split_names,
)
from agentflow.scheduler.policies import PRESET_LENGTH_MODELS, PRESETS

META = "eval.json"
META_FORMAT = "agentflow-eval/1"
# Simulated mode's default: every preset that uses the learned length model.
SIM_POLICIES = tuple(name for name in PRESETS if name not in PRESET_LENGTH_MODELS)

Backends = Mapping[str, Any] | Callable[[str, str], Mapping[str, Any]]


def run_eval(dataset: str | None = None, *, out: str | Path,
             pipelines: str | Sequence[str] | None = None,
             policies: str | Sequence[str] | None = None,
             limit: int | None = None, seed: int = 0,
             config: AgentFlowConfig | dict | str | Path | None = None,
             cluster: str | None = None, traces: str | Path | None = None,
             rate: float | None = None, arrival: str | None = None, slo_scale: float = 2.0,
             slo_s: float | None = None, eval_timeout_s: float = 30.0,
             backends: Backends | None = None, plots: bool = True,
             progress: bool = True, console: Any = None,
             keep_distinct: bool = False, slo_class: str = "batch") -> dict[str, Any]:
    """Evaluate pipelines x policies on a dataset; write records, ``summary.json``,
    ``report.md`` and plots under ``out``; return the summary.

    Real mode (no ``cluster``): each question runs through the real pipeline on the backends of
    ``config`` (or ``backends``: a dict of name -> LLMBackend, or a function
    ``(pipeline, policy) -> dict`` making fresh ones per run), submitted at arrival times
    (``rate`` q/s by ``arrival``), or one at a time without a rate. Rerunning with the same
    ``out`` skips questions already finished.

    Simulated mode (``cluster``): the traces of a real run in ``out`` (or ``traces``) are
    replayed on the simulated cluster under each policy; reports go to
    ``out/simulated-<cluster>/``.

    ``keep_distinct``: judge with DISTINCT kept, the official Spider evaluator's
    ``--keep_distinct``; by default it is stripped, as that evaluator does by default.

    ``slo_class``: the SLO class every question runs in, ``batch`` by default — nobody waits
    on each one, so an evaluation beside interactive users on the same cluster is ranked and
    shed behind them (``agentflow.slo_classes``). Give ``interactive`` to measure the latency
    a person would see. A simulated replay runs each query in the class too (the scheduler
    sees it; each record says the class it was admitted in), with the deadline
    ``slo_scale`` x idle latency as before: the replay holds only the evaluation's own
    queries, all of one class, so the class decides nothing among them — it would beside
    other tenants (``agentflow simulate --tenant``).
    """
    from rich.console import Console

    console = console or Console(stderr=True)
    _check_numbers(limit=limit, rate=rate, slo_scale=slo_scale, slo_s=slo_s,
                   eval_timeout_s=eval_timeout_s)
    if out is None or not str(out).strip():
        raise EvalError("--out is required: the folder for records, traces and reports")
    out = Path(out).expanduser()
    if out.exists() and not out.is_dir():
        raise EvalError(f"--out {out} exists and is not a folder")
    pipeline_list = split_names(pipelines, "pipeline")
    policy_list = split_names(policies, "policy")
    check_pipelines(pipeline_list)
    if cluster is None:
        if traces is not None:
            raise EvalError("--traces replays a recording on a simulated cluster; give "
                            "--cluster too (real mode records its own traces)")
        if dataset is None:
            raise EvalError("--dataset is required: spider:DIR[:split], bird:DIR[:split] or demo")
        _check_arrival(rate, arrival, simulated=False)
        check_policies(policy_list, simulated=False)
        return _real(dataset, out=out, pipelines=pipeline_list, policies=policy_list,
                     limit=limit, seed=seed, config=config, rate=rate, arrival=arrival,
                     slo_scale=slo_scale, slo_s=slo_s, eval_timeout_s=eval_timeout_s,
                     backends=backends, plots=plots, progress=progress, console=console,
                     keep_distinct=keep_distinct, slo_class=slo_class)
    if config is not None:
        raise EvalError("--config sets up real backends and --cluster selects the simulator; "
                        "give one of them")
    if backends is not None:
        raise EvalError("backends are for real mode; the simulated cluster has its own")
    if slo_s is not None:
        raise EvalError("--slo (seconds) is for real mode; in simulated mode each query's "
                        "deadline is --slo-scale x its idle latency")
    _check_arrival(rate, arrival, simulated=True)
    check_policies(policy_list, simulated=True)
    return _simulated(dataset, out=out, cluster=cluster, traces=traces,
                      pipelines=pipeline_list, policies=policy_list or list(SIM_POLICIES),
                      limit=limit, seed=seed, rate=rate if rate is not None else 1.0,
                      arrival=arrival or "poisson", slo_scale=slo_scale,
                      eval_timeout_s=eval_timeout_s, plots=plots, progress=progress,
                      console=console, keep_distinct=keep_distinct, slo_class=slo_class)


# ------------------------------------------------------------------------------ checks
def _check_numbers(*, limit, rate, slo_scale, slo_s, eval_timeout_s) -> None:
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise EvalError(f"--limit must be a positive number of questions, got {limit!r}")
    if rate is not None and not rate > 0:
        raise EvalError(f"--rate must be a positive number of queries per second, got {rate!r}")
    if not slo_scale > 0:
        raise EvalError(f"--slo-scale must be positive, got {slo_scale!r}")
    if slo_s is not None and not slo_s > 0:
        raise EvalError(f"--slo must be a positive number of seconds, got {slo_s!r}")
    if not eval_timeout_s > 0:
        raise EvalError(f"--eval-timeout must be positive, got {eval_timeout_s!r}")


def _check_arrival(rate: float | None, arrival: str | None, *, simulated: bool) -> None:
    from agentflow.sim.workload import arrival_times

    if arrival is None:
        return
    if not simulated and rate is None and not arrival.startswith("steps:"):
        raise EvalError(f"--arrival {arrival} needs --rate (queries per second); without a rate "
                        "questions are asked one at a time")
    try:
        arrival_times(2, rate or 1.0, arrival, seed=0)
    except (ValueError, IndexError) as err:
        hint = "" if "poisson" in str(err) else "; use poisson, gamma:CV or steps:RATE/SECONDS,..."
        raise EvalError(f"--arrival {arrival!r}: {err}{hint}") from None


def _load_config(config: AgentFlowConfig | dict | str | Path | None) -> AgentFlowConfig:
    if config is None:
        return AgentFlowConfig()
    if isinstance(config, AgentFlowConfig):
        return config.model_copy(deep=True)
    try:
        if isinstance(config, dict):
            return AgentFlowConfig.model_validate(config)
        return AgentFlowConfig.load(config)
    except FileNotFoundError as err:
        raise EvalError(f"--config: {err}") from None
    except ValueError as err:  # pydantic's ValidationError is a ValueError
        raise EvalError(f"--config {config}: {err}") from None


def _digest(config: AgentFlowConfig, backends: Any) -> str:
    data = config.model_dump(mode="json")
    data.pop("record", None)
    data["scheduler"].pop("policy", None)
    if backends is not None:
        data["backends"] = "python" if callable(backends) else sorted(
            f"{k}:{type(v).__name__}" for k, v in backends.items())
    return hashlib.sha1(json.dumps(data, sort_keys=True).encode()).hexdigest()[:12]


def _read_meta(out: Path) -> dict[str, Any] | None:
    path = out / META
    if not path.is_file():
        return None
    try:
        meta = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise EvalError(f"{path} is not valid JSON ({err}); move it away to start over") from None
    if meta.get("format") != META_FORMAT:
        raise EvalError(f"{path} is not an agentflow eval record ({META_FORMAT})")
    return meta


def _instances_text(config: AgentFlowConfig, backends: Mapping[str, Any] | None) -> str:
    if backends:
        return ", ".join(f"{k} ({type(v).__name__}, given in Python)" for k, v in backends.items())
    return ", ".join(f"{i.name} ({i.backend.get('type', '?')}"
                     + (f", {i.model}" if i.model else "") + (f" on {i.gpu}" if i.gpu else "")
                     + ")" for i in config.instances)


def _progress(console, enabled: bool):
    if not enabled:
        return nullcontext(None)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("{task.fields[status]}"), TimeElapsedColumn(), console=console,
                    transient=False)


# ------------------------------------------------------------------------------ real mode
def _real(dataset: str, *, out: Path, pipelines: list[str], policies: list[str],
          limit: int | None, seed: int, config, rate: float | None, arrival: str | None,
          slo_scale: float, slo_s: float | None, eval_timeout_s: float, backends,
          plots: bool, progress: bool, console, keep_distinct: bool = False,
          slo_class: str = "batch") -> dict[str, Any]:
    from agentflow.evaluation.real import arrival_offsets, run_config, run_real
    from agentflow.slo_classes import choose_class

    spec = parse_dataset_spec(dataset)
    base = _load_config(config)
    try:  # refused before any backend starts
        choose_class(slo_class, None, base.scheduler.slo_classes)
    except ValueError as err:
        raise EvalError(f"--slo-class: {err}") from None
    pipelines = pipelines or [base.pipeline]
    check_pipelines(pipelines)
    policies = policies or [base.scheduler.policy]
    check_policies(policies, simulated=False)
    meta = _read_meta(out) or {"format": META_FORMAT, "dataset": spec.to_dict(), "runs": {}}
    if meta["dataset"] != spec.to_dict():
        raise EvalError(f"{out} holds an evaluation of {DatasetSpec(**meta['dataset']).label}, "
                        f"not {spec.label}; use another --out")
    ds = load_spec(spec)
    if not ds.examples:
        raise EvalError(f"{spec.label} has no questions")
    examples = sample_examples(ds, limit, seed)
    out.mkdir(parents=True, exist_ok=True)
    session = time.strftime("%Y%m%dT%H%M%S") + f"-{time.monotonic_ns() % 10**6:06d}"
    judge = Judge(ds, engine=base.engine, timeout_s=eval_timeout_s, keep_distinct=keep_distinct)
    digest = _digest(base, backends)
    runs = [(p, q, run_key(p, q)) for p in pipelines for q in policies]
    stores: dict[str, RecordStore] = {}
    for _pipeline, _policy, key in runs:
        store = stores[key] = RecordStore(out / "records" / f"{key}.jsonl")
        old = meta["runs"].get(key)
        if old and old.get("config_digest") != digest and store.finished_ids():
            raise EvalError(
                f"{out}/records/{key}.jsonl was recorded with a different configuration "
                f"(instances, backends or pipeline parameters); use another --out, or delete "
                f"that file and traces/{key}.jsonl to run it again")
    ids = [e.id for e in examples]
    asked: dict[str, int] = {}
    reused: dict[str, int] = {}
    try:
        with _progress(console, progress) as bar:
            for pipeline, policy, key in runs:
                store = stores[key]
                done = store.finished_ids()
                pending = [e for e in examples if e.id not in done]
                reused[key] = len(examples) - len(pending)
                task = None
                if bar is not None:
                    task = bar.add_task(key, total=len(examples), completed=reused[key],
                                        status=_status_text(store.for_examples(ids)))

                def on_record(record: dict[str, Any], task=task, store=store) -> None:
                    if bar is not None:
                        bar.update(task, advance=1,
                                   status=_status_text(store.for_examples(ids)))

                trace_path = out / "traces" / f"{key}.jsonl"
                previous = meta["runs"].get(key, {})
                meta["runs"][key] = {"pipeline": pipeline, "policy": policy,
                                     "config_digest": digest,
                                     "records": f"records/{key}.jsonl",
                                     "trace": f"traces/{key}.jsonl",
                                     "instances": previous.get("instances",
                                                               _instances_text(base, None)),
                                     "scripted": previous.get("scripted", False)}
                _write_meta(out, meta)
                if pending:
                    cfg = run_config(base, policy=policy, trace_path=trace_path,
                                     dataset_root=None if spec.kind == "demo" else spec.root,
                                     split=spec.split)
                    made = backends(pipeline, policy) if callable(backends) else backends
                    meta["runs"][key]["instances"] = _instances_text(base, made)
                    meta["runs"][key]["scripted"] = bool(made) and any(
                        "Scripted" in type(v).__name__ for v in made.values())
                    _write_meta(out, meta)
                    asked[key] = run_real(
                        pending, kind=ds.kind, pipeline=pipeline, policy=policy, config=cfg,
                        store=store, judge=judge, backends=dict(made) if made else None,
                        offsets=arrival_offsets(len(pending), rate, arrival, seed),
                        slo_s=slo_s, session=session, on_record=on_record,
                        slo_class=slo_class)
                else:
                    asked[key] = 0
    finally:
        judge.close()

    records = {key: stores[key].for_examples(ids) for _, _, key in runs}
    summaries = {}
    for pipeline, policy, key in runs:
        s = summarize_run(records[key], slo_scale=slo_scale)
        s = {"pipeline": pipeline, "policy": policy, "asked_now": asked.get(key, 0),
             "reused": reused.get(key, 0),
             "difficulty_sources": sorted({r.get("difficulty_source") or "?"
                                           for r in records[key]}), **s}
        if reused.get(key) and asked.get(key):
            s["note"] = (f"{reused[key]} questions finished in an earlier session were reused; "
                         "throughput adds up each session's serving span")
        elif reused.get(key):
            s["note"] = "every question was finished in an earlier session (nothing asked now)"
        summaries[key] = s
    arrivals = ("one question at a time (each submitted when the previous one finished)"
                if rate is None and not (arrival or "").startswith("steps:")
                else f"{arrival or 'poisson'} at {rate:g} q/s, seed {seed}" if rate
                else f"{arrival}, seed {seed}")
    scripted = any(meta["runs"][key].get("scripted") for _, _, key in runs)
    instances = list(dict.fromkeys(meta["runs"][key]["instances"] for _, _, key in runs))
    items = {
        "accuracy": "measured — each answer's SQL executed on the dataset's database and "
                    "compared with the gold SQL's result (Spider test-suite rule and BIRD rule; "
                    + rules_note(keep_distinct) + ")",
        "latency": "measured wall-clock time from submission to answer, with the arrivals "
                   "below",
        "queue wait vs run time": "measured per LLM call by the scheduler (queue: waiting for "
                                  "an instance; run: on the instance)",
        "idle latency and SLO attainment": "derived from the measured stage times (below)",
        "LLM calls and tokens": "measured, as counted by the backends",
    }
    if scripted:
        items["backends"] = ("a scripted backend (NOT a model: canned answers, artificial "
                             "timing) — these numbers test the evaluation, not a model")
    summary = {
        "format": "agentflow-eval-summary/1", "mode": "real",
        "measured": {"statement": "Every question was answered by the real pipeline on the "
                                  "configured backends; nothing below is simulated.",
                     "items": items},
        "dataset": {**spec.to_dict(), "kind": ds.kind, "questions": len(examples),
                    "split_size": len(ds.examples)},
        "settings": {"pipelines": pipelines, "policies": policies, "limit": limit,
                     "seed": seed, "rate": rate, "arrival": arrival, "arrivals": arrivals,
                     "slo_scale": slo_scale, "slo_s": slo_s, "eval_timeout_s": eval_timeout_s,
                     "instances": "; ".join(instances), "engine": base.engine,
                     "slo_class": slo_class},
        "idle_latency": ("the critical path of each query's DAG, where every stage counts its "
                         "own run time without queue waits (the stage's duration minus the "
                         "time its LLM calls waited for an instance), measured in this run."),
        "runs": summaries,
        "files": {"per-question records": "records/<pipeline>__<policy>.jsonl",
                  "traces (replayable with --cluster)": "traces/<pipeline>__<policy>.jsonl",
                  "run settings (for resuming)": META},
    }
    return _write_outputs(out, summary, records, plots)


def _status_text(records: list[dict[str, Any]]) -> str:
    judged = [r for r in records if r.get("correct") is not None]
    if not judged:
        return ""
    acc = sum(bool(r["correct"]) for r in judged) / len(judged)
    return f"EX {100 * acc:.0f}%"


def _write_meta(out: Path, meta: dict[str, Any]) -> None:
    tmp = out / (META + ".tmp")
    tmp.write_text(json.dumps(meta, indent=2) + "\n")
    tmp.replace(out / META)


def _write_outputs(folder: Path, summary: dict[str, Any],
                   records: dict[str, list[dict[str, Any]]], plots: bool) -> dict[str, Any]:
    folder.mkdir(parents=True, exist_ok=True)
    made = write_plots(folder / "plots", summary, records) if plots else {}
    summary["plots"] = made
    write_summary(folder / "summary.json", summary)
    write_report(folder / "report.md", summary, made)
    summary["out"] = str(folder)
    return summary


# ------------------------------------------------------------------------------ simulated
def _simulated(dataset: str | None, *, out: Path, cluster: str, traces, pipelines: list[str],
               policies: list[str], limit: int | None, seed: int, rate: float, arrival: str,
               slo_scale: float, eval_timeout_s: float, plots: bool, progress: bool,
               console, keep_distinct: bool = False, slo_class: str = "batch"
               ) -> dict[str, Any]:
    from agentflow.evaluation.simulated import load_source, simulate
    from agentflow.sim.cluster import load_cluster
    from agentflow.slo_classes import resolve_class

    try:  # the simulated cluster has the default classes (no config is read)
        resolve_class(slo_class)
    except ValueError as err:
        raise EvalError(f"--slo-class: {err}") from None

    try:
        cluster_cfg = load_cluster(cluster)
    except ValueError as err:
        raise EvalError(f"--cluster: {err}") from None
    meta = _read_meta(out)
    spec = parse_dataset_spec(dataset) if dataset else (
        DatasetSpec(**meta["dataset"]) if meta else None)
    if meta and dataset and spec is not None and meta["dataset"] != spec.to_dict():
        raise EvalError(f"{out} holds an evaluation of {DatasetSpec(**meta['dataset']).label}, "
                        f"not {spec.label}; use another --out")
    ds = load_spec(spec) if spec else None
    examples = sample_examples(ds, limit, seed) if ds and limit else (ds.examples if ds else [])
    by_question = {(e.db_id, e.question): e for e in examples}
    judge = Judge(ds, timeout_s=eval_timeout_s, keep_distinct=keep_distinct) if ds else None
    sample_ids = {e.id for e in examples} if limit and ds else None

    sources = []
    try:
        if traces is not None:
            trace_path = Path(traces).expanduser()
            if not trace_path.is_file():
                raise EvalError(f"--traces: file not found: {trace_path}")
            names = _trace_pipelines(trace_path)
            if pipelines:
                missing = [p for p in pipelines if p not in names]
                if missing:
                    raise EvalError(f"--traces {trace_path} has no query of pipeline "
                                    f"{missing[0]!r} (it has {', '.join(names) or 'none'})")
                names = pipelines
            index: dict[str, dict[str, Any]] = {}
            for f in sorted((out / "records").glob("*.jsonl")):
                for r in RecordStore(f).records.values():
                    if r.get("query_id") and r.get("status") in ("done", "unsure", "failed"):
                        index[r["query_id"]] = r
            for name in names:
                sources.append(load_source(name, trace_path, None, records_by_query=index,
                                           strict=False, examples_by_question=by_question,
                                           kind=ds.kind if ds else None, judge=judge))
        else:
            if meta is None or not meta.get("runs"):
                raise EvalError(f"no recorded real run in {out}: run `agentflow eval` without "
                                "--cluster first (same --out), or pass --traces FILE")
            recorded: dict[str, tuple[str, dict[str, Any]]] = {}
            for key, run in meta["runs"].items():
                if (out / run["trace"]).is_file():
                    recorded.setdefault(run["pipeline"], (key, run))
            names = pipelines or list(recorded)
            for name in names:
                if name not in recorded:
                    raise EvalError(f"{out} has no recorded traces of pipeline {name!r} "
                                    f"(recorded: {', '.join(recorded) or 'none'})")
                key, run = recorded[name]
                store = RecordStore(out / run["records"])
                index = {r["query_id"]: r for r in store.records.values()
                         if r.get("query_id") and r.get("status") in ("done", "unsure", "failed")}
                sources.append(load_source(name, out / run["trace"], run["policy"],
                                           records_by_query=index, strict=True,
                                           examples_by_question=by_question,
                                           kind=ds.kind if ds else None, judge=judge))
    finally:
        if judge is not None:
            judge.close()
    if sample_ids is not None:
        for source in sources:
            keep = [q for q in source.queries if source.base[q.id]["example_id"] in sample_ids]
            dropped = len(source.queries) - len(keep)
            if dropped:
                source.skipped["outside the --limit sample"] = dropped
            source.queries = keep

    sim_out = out / f"simulated-{cluster_cfg.name}"
    records: dict[str, list[dict[str, Any]]] = {}
    summaries: dict[str, dict[str, Any]] = {}
    with _progress(console, progress) as bar:
        for source in sources:
            tasks = {}
            if bar is not None:
                for policy in policies:
                    tasks[policy] = bar.add_task(f"{run_key(source.pipeline, policy)} (sim)",
                                                 total=len(source.queries), status="")

            def on_record(policy: str, record: dict[str, Any], tasks=tasks) -> None:
                if bar is not None:
                    bar.update(tasks[policy], advance=1)

            results = simulate(source, cluster_name=cluster, policies=policies, rate=rate,
                               arrival=arrival, seed=seed, slo_scale=slo_scale,
                               on_record=on_record, slo_class=slo_class)
            for policy, recs in results.items():
                key = run_key(source.pipeline, policy)
                path = sim_out / "records" / f"{key}.jsonl"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text("".join(json.dumps(r, default=str) + "\n" for r in recs))
                records[key] = recs
                s = summarize_run(recs, slo_scale=slo_scale)
                note = f"replays {source.trace_path}"
                if source.recorded_policy:
                    note += f" (recorded under policy {source.recorded_policy})"
                if source.skipped:
                    note += "; left out: " + ", ".join(f"{v} {k}" for k, v in
                                                       source.skipped.items())
                summaries[key] = {"pipeline": source.pipeline, "policy": policy,
                                  "recorded_policy": source.recorded_policy,
                                  "trace": str(source.trace_path), "skipped": source.skipped,
                                  "difficulty_sources": sorted(
                                      {r.get("difficulty_source") or "?" for r in recs}),
                                  "note": note, **s}
    inst = ", ".join(f"{i.count}x {i.gpu} ({i.model}, {i.weight_bits}-bit weights)"
                     for i in cluster_cfg.instances)
    summary = {
        "format": "agentflow-eval-summary/1", "mode": "simulated",
        "measured": {
            "statement": (f"The recorded answers of a real run were replayed on the simulated "
                          f"cluster {cluster_cfg.name}; accuracy is measured (from the "
                          "recording), latency is simulated."),
            "items": {
                "accuracy": "measured in the recorded real run (the SQL does not change in a "
                            "replay); the same for every policy; " + rules_note(keep_distinct),
                "latency and throughput": "simulated — agentflow.sim replays each query's "
                                          "recorded DAG (LLM calls by their token counts) on "
                                          "simulated GPUs, with the real scheduler objects and "
                                          "the same arrivals for every policy",
                "wait vs run time": "simulated — run: the stage alone on an idle cluster; "
                                    "wait: the rest (queueing and batching slowdown)",
                "tool steps": "their durations as measured in the recording",
                "LLM calls and tokens": "measured in the recorded run",
            }},
        "dataset": {**(spec.to_dict() if spec else {"kind": "unknown", "root": "?",
                                                     "split": "?"}),
                    "questions": max((len(r) for r in records.values()), default=0)},
        "settings": {"pipelines": [s.pipeline for s in sources], "policies": policies,
                     "limit": limit, "seed": seed, "rate": rate, "arrival": arrival,
                     "arrivals": f"{arrival} at {rate:g} q/s (simulated), seed {seed}",
                     "slo_scale": slo_scale, "slo_class": slo_class,
                     "cluster": cluster_cfg.name, "instances": inst},
        "idle_latency": ("the simulator's estimate — the critical path of the query's DAG with "
                         "each LLM stage timed alone on an idle instance, averaged over the "
                         "cluster's GPU types (as HexGen-Flow defines it), and tool steps at "
                         f"their recorded duration. Each query's deadline for the scheduler was "
                         f"{slo_scale:g} x its idle latency."),
        "runs": summaries,
        "files": {"per-question records (recorded answer + simulated timing)":
                  "records/<pipeline>__<policy>.jsonl",
                  "replayed traces": ", ".join(sorted({str(s.trace_path) for s in sources}))},
    }
    return _write_outputs(sim_out, summary, records, plots)


def _trace_pipelines(path: Path) -> list[str]:
    names: list[str] = []
    with path.open() as fh:
        for line in fh:
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                raise EvalError(f"--traces {path}: not an agentflow JSONL trace") from None
            name = (rec.get("pipeline") or {}).get("name") if isinstance(rec, dict) else None
            if name is None:
                raise EvalError(f"--traces {path}: not an agentflow JSONL trace (a line has no "
                                "pipeline)")
            if name not in names:
                names.append(name)
    return names
