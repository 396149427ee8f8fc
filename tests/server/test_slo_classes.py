"""Issue 22 §1, the serving side: every query carries an SLO class from the user to the
backend. Over real HTTP on loopback (uvicorn): the request's ``slo_class``, else the API key's
tenant's, else ``standard``; an unknown one is a 400 naming the classes; the class's
``slo_seconds`` is the deadline when the request gives none; its rank reaches each LLM call.
``agentflow eval`` runs as ``batch`` by default. The OpenAI-compatible backend's ``priority``
is checked in the body a real loopback HTTP server received. Instances are scripted (not a
model) except that recording server, which is not a model either: it streams a fixed SQL."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from agentflow.api import AgentFlow, InvalidRequest  # noqa: E402
from agentflow.config import AgentFlowConfig  # noqa: E402
from agentflow.evaluation import EvalError, run_eval  # noqa: E402
from agentflow.llm.scripted import ScriptedBackend  # noqa: E402
from agentflow.server.testing import LiveServer  # noqa: E402
from agentflow.slo_classes import UnknownSloClassError, class_table  # noqa: E402
from tests.server.utils import error_of  # noqa: E402

pytestmark = pytest.mark.timeout(120)

SQL = "SELECT count(*) FROM stores"
KEYS = {"page": "page-key-0001", "evalrun": "eval-key-0002", "plain": "plain-key-0003"}
CLASSES = {"interactive": {"slo_seconds": 12}, "batch": {"slo_seconds": 900},
           "gold": {"rank": 0, "weight": 3}}


def script(request: Any) -> str:
    return "stores" if request.stage == "extract_keywords" else SQL


def ranks_of(backend: ScriptedBackend, query_id: str) -> set[int]:
    return {r.slo_rank for r in backend.calls if r.query_id == query_id}


# ------------------------------------------------------------------ config
def test_config_merges_slo_classes_over_the_defaults() -> None:
    config = AgentFlowConfig.model_validate({"scheduler": {"slo_classes": CLASSES}})
    table = config.scheduler.slo_classes
    assert sorted(table) == ["batch", "gold", "interactive", "standard"]
    assert (table["batch"].rank, table["batch"].slo_seconds) == (2, 900)  # rank kept
    assert (table["interactive"].rank, table["interactive"].slo_seconds) == (0, 12)
    assert (table["gold"].rank, table["gold"].weight, table["gold"].slo_seconds) == (0, 3, None)
    assert table["standard"] == AgentFlowConfig().scheduler.slo_classes["standard"]
    # the table reaches the coordinator serving builds
    with AgentFlow(config, backends={"cpu-0": ScriptedBackend(script)}) as af:
        assert af.router.coordinator.slo_classes["batch"].slo_seconds == 900


@pytest.mark.parametrize("bad, message", [
    ({"batch": {"rank": -1}}, "greater than or equal to 0"),
    ({"batch": {"slo_seconds": 0}}, "greater than 0"),
    ({"batch": {"priority": 1}}, "Extra inputs are not permitted"),
    ({"batch": 5}, "expected a mapping of SloClass fields"),
    ({"batch": {"name": "other"}}, "its name field says 'other'"),
    (["batch"], "must map class names"),
])
def test_config_refuses_bad_slo_classes(bad: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        AgentFlowConfig.model_validate({"scheduler": {"slo_classes": bad}})


def test_class_table_without_configuration_is_the_defaults() -> None:
    assert {n: c.rank for n, c in class_table(None).items()} == \
        {"interactive": 0, "standard": 1, "batch": 2}


# ------------------------------------------------------------------ HTTP, end to end
@pytest.fixture(scope="module")
def served() -> Iterator[tuple[LiveServer, ScriptedBackend]]:
    config = AgentFlowConfig(fewshot=None, pipeline="single", slo_s=45,
                             scheduler={"slo_classes": CLASSES})
    backend = ScriptedBackend(script, latency_s=0.01)
    settings = {"api_keys": [KEYS["plain"]], "tenants": [
        {"name": "page", "keys": [KEYS["page"]], "slo_class": "interactive"},
        {"name": "evalrun", "keys": [KEYS["evalrun"]], "slo_class": "batch"}]}
    with AgentFlow(config, backends={"cpu-0": backend}) as af, \
            LiveServer({}, settings, agentflow=af) as live:
        yield live, backend


def ask(live: LiveServer, who: str, **body: Any) -> httpx.Response:
    body = {"question": "How many stores are there?", "db": "bookshop", **body}
    return httpx.post(f"{live.url}/v1/queries", json=body,
                      headers={"Authorization": f"Bearer {KEYS[who]}"}, timeout=60)


@pytest.mark.parametrize("who, body, klass, rank, slo", [
    ("page", {}, "interactive", 0, 12),            # the tenant's class and its deadline
    ("evalrun", {}, "batch", 2, 900),
    ("plain", {}, "standard", 1, 45),               # no class: standard, the config's slo_s
    ("page", {"slo_class": "standard"}, "standard", 1, 45),  # the request wins, downwards
    ("page", {"slo_class": "batch", "slo_seconds": 30}, "batch", 2, 30),  # given slo wins
    ("page", {"slo_class": "gold"}, "gold", 0, 45),  # a configured class, no deadline
    ("plain", {"slo_class": "batch"}, "batch", 2, 900),
])
def test_class_from_request_or_tenant_reaches_every_call(served, who, body, klass, rank,
                                                         slo) -> None:
    live, backend = served
    r = ask(live, who, **body)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["status"] == "done" and answer["sql"] == SQL
    assert (answer["slo_class"], answer["slo_s"]) == (klass, slo)
    assert ranks_of(backend, answer["query_id"]) == {rank}  # every LLM call of the query
    got = httpx.get(f"{live.url}/v1/queries/{answer['query_id']}",
                    headers={"Authorization": f"Bearer {KEYS[who]}"}).json()
    assert got["slo_class"] == klass
    listed = httpx.get(f"{live.url}/v1/queries",
                       headers={"Authorization": f"Bearer {KEYS[who]}"}).json()["queries"]
    assert {q["query_id"]: q["slo_class"] for q in listed}[answer["query_id"]] == klass


@pytest.mark.parametrize("who, asked, ceiling", [
    ("evalrun", "interactive", "batch"), ("evalrun", "standard", "batch"),
    ("plain", "interactive", "standard"), ("plain", "gold", "standard"),
])
def test_a_tenants_class_is_a_ceiling(served, who: str, asked: str, ceiling: str) -> None:
    """Issue 35 §7: a batch (or class-less, so standard) key cannot ask to be served ahead of
    its class; nothing runs, and the error names the ceiling."""
    live, backend = served
    before = len(backend.calls)
    r = ask(live, who, slo_class=asked)
    assert r.status_code == 403, r.text
    err = error_of(r)
    assert err["code"] == "slo_class_not_allowed" and err["ceiling"] == ceiling
    assert f"'{asked}'" in err["message"]
    assert len(backend.calls) == before


def test_unknown_class_is_a_400_that_lists_the_classes(served) -> None:
    live, backend = served
    before = len(backend.calls)
    r = ask(live, "page", slo_class="urgent")
    assert r.status_code == 400
    err = error_of(r)
    assert err["code"] == "unknown_slo_class"
    assert "'urgent'" in err["message"] and "batch, gold, interactive, standard" in err["message"]
    assert err["classes"] == ["batch", "gold", "interactive", "standard"]
    assert len(backend.calls) == before  # nothing ran
    # a request whose class is not even a valid name is the validation error, on the field
    r = ask(live, "page", slo_class="")
    assert r.status_code == 422 and "slo_class" in error_of(r)["message"]


def test_metrics_split_latency_by_class(served) -> None:
    live, _ = served
    assert ask(live, "evalrun").status_code == 200
    text = httpx.get(f"{live.url}/metrics",
                     headers={"Authorization": f"Bearer {KEYS['plain']}"})
    # /metrics wants an admin key; read the registry the route renders instead
    assert text.status_code == 403
    rendered = live.service.metrics.render().decode()
    assert 'agentflow_class_query_latency_seconds_count{slo_class="batch",status="done"}' \
        in rendered


def test_a_tenant_with_an_unknown_class_fails_at_start_up() -> None:
    settings = {"tenants": [{"name": "x", "keys": ["x-key-0001"], "slo_class": "urgent"}]}
    config = AgentFlowConfig(fewshot=None, pipeline="single")
    with AgentFlow(config, backends={"cpu-0": ScriptedBackend(script)}) as af:
        with pytest.raises(ValueError, match="tenant 'x': unknown SLO class 'urgent'"):
            LiveServer({}, settings, agentflow=af)


def test_python_api_takes_slo_class(tmp_path: Path) -> None:
    backend = ScriptedBackend(script)
    config = AgentFlowConfig(fewshot=None, pipeline="single")
    trace = tmp_path / "trace.jsonl"
    with AgentFlow(config, backends={"cpu-0": backend}) as af:
        answer = af.ask("How many stores are there?", db="bookshop", slo_class="batch",
                        tenant="runner", record=trace)
        assert answer.ok and answer.slo_class == "batch"
        assert ranks_of(backend, answer.query_id) == {2}
        recorded = json.loads(trace.read_text().splitlines()[0])  # a replay can keep the class
        assert (recorded["slo_class"], recorded["tenant"]) == ("batch", "runner")
        assert af.ask("How many stores?", db="bookshop").slo_class == "standard"
        with pytest.raises(UnknownSloClassError, match="choose from batch, interactive"):
            af.submit("How many stores?", db="bookshop", slo_class="nope")
        with pytest.raises(InvalidRequest):  # the family callers already catch
            af.submit("How many stores?", db="bookshop", slo_class="nope")


def test_mcp_ask_takes_slo_class_over_the_tenants() -> None:
    pytest.importorskip("mcp")
    import asyncio

    from agentflow.mcp.server import AgentflowTools
    from agentflow.tenants import Tenant

    backend = ScriptedBackend(script)
    with AgentFlow(AgentFlowConfig(fewshot=None, pipeline="single"),
                   backends={"cpu-0": backend}) as af:
        tools = AgentflowTools(af)
        runner = Tenant(name="runner", slo_class="batch")
        answer = asyncio.run(tools.ask("How many stores?", "bookshop", caller=runner))
        assert answer["slo_class"] == "batch" and ranks_of(backend, answer["query_id"]) == {2}
        from agentflow.slo_classes import SloClassNotAllowedError

        with pytest.raises(SloClassNotAllowedError):  # its class is a ceiling (issue 35 §7)
            asyncio.run(tools.ask("How many stores?", "bookshop", caller=runner,
                                  slo_class="interactive"))
        page = Tenant(name="page", slo_class="interactive")
        answer = asyncio.run(tools.ask("How many stores?", "bookshop", caller=page,
                                       slo_class="batch"))
        assert answer["slo_class"] == "batch"
        assert ranks_of(backend, answer["query_id"]) == {2}


# ------------------------------------------------------------------ eval
def test_eval_runs_as_batch_by_default(tmp_path: Path) -> None:
    made: list[ScriptedBackend] = []

    def backends(pipeline: str, policy: str) -> dict[str, ScriptedBackend]:
        made.append(ScriptedBackend(script))
        return {"cpu-0": made[-1]}
    common: dict[str, Any] = {"pipelines": "single", "policies": "vllm", "limit": 2,
                              "config": AgentFlowConfig(fewshot=None), "backends": backends,
                              "progress": False, "plots": False}
    summary = run_eval("demo", out=tmp_path / "batch", **common)
    assert summary["settings"]["slo_class"] == "batch"
    assert made[-1].calls and {r.slo_rank for r in made[-1].calls} == {2}
    summary = run_eval("demo", out=tmp_path / "inter", slo_class="interactive", **common)
    assert {r.slo_rank for r in made[-1].calls} == {0}
    with pytest.raises(EvalError, match="--slo-class: unknown SLO class 'nope'"):
        run_eval("demo", out=tmp_path / "bad", slo_class="nope", **common)


def test_eval_cli_defaults_to_batch() -> None:
    import argparse

    from agentflow.cli import evaluate

    parser = argparse.ArgumentParser()
    evaluate.register(parser.add_subparsers())
    assert parser.parse_args(["eval", "--dataset", "demo"]).slo_class == "batch"
    assert parser.parse_args(["eval", "--slo-class", "interactive"]).slo_class == "interactive"


# ------------------------------------------------------------------ vLLM priority on the wire
class _Recorder(BaseHTTPRequestHandler):
    """An OpenAI-compatible /v1/completions that streams a fixed SQL continuation and keeps
    every JSON body it was sent (NOT a model)."""

    bodies: list[dict[str, Any]] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).bodies.append(body)
        text = " count(*) FROM stores" if "SELECT" in body.get("prompt", "")[-8:] else "stores"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for piece, finish in ((text, None), ("", "stop")):
            chunk = {"id": "c1", "object": "text_completion", "created": 0, "model": "m",
                     "choices": [{"index": 0, "text": piece, "finish_reason": finish}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        usage = {"id": "c1", "object": "text_completion", "created": 0, "model": "m",
                 "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 4,
                                          "total_tokens": 9}}
        self.wfile.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def recorder() -> Iterator[str]:
    pytest.importorskip("openai")
    _Recorder.bodies = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("vllm_priority", [True, False])
def test_openai_backend_sends_the_class_rank_as_vllm_priority(recorder: str,
                                                              vllm_priority: bool) -> None:
    instance = {"name": "vllm-0", "backend": {"type": "openai", "base_url": recorder,
                                              "model": "m", "vllm_priority": vllm_priority}}
    config = AgentFlowConfig(fewshot=None, pipeline="single", instances=[instance])
    with AgentFlow(config) as af:
        for klass in ("interactive", "batch", "standard"):
            answer = af.ask("How many stores are there?", db="bookshop", slo_class=klass)
            assert answer.ok and answer.sql == SQL, answer.error
    bodies = _Recorder.bodies
    per_query = len(bodies) // 3  # the same pipeline each time: as many calls per query
    assert per_query >= 1 and len(bodies) == 3 * per_query
    assert all(b["model"] == "m" and b["prompt"].endswith("SELECT") for b in bodies)
    if vllm_priority:
        # the queries' calls in order: interactive, batch, standard; each sent its class band
        # first (counted from standard's, PRIORITY_BAND apart), then its place in the queue
        # order within it (``scheduler.classes.engine_priority``, issue 38)
        from agentflow.scheduler.classes import PRIORITY_BAND
        assert [b["priority"] // PRIORITY_BAND for b in bodies] == [-2] * per_query \
            + [2] * per_query + [0] * per_query
    else:
        assert not any("priority" in b for b in bodies)  # a server without the policy


# ------------------------------------------------------------------ the loopback benchmark
@pytest.mark.slow
def test_serving_classes_benchmark_runs_and_prints_the_ratios(tmp_path: Path) -> None:
    """The benchmark end to end on a real server, with short phases (no timing asserted:
    only that each class in each phase got answers and the ratios are printed)."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "figures.json"
    done = subprocess.run([sys.executable, "-m", "agentflow.bench", "serving_classes",
                           "--policies", "vllm", "--phase-s", "6", "--warmup-s", "1",
                           "--latency", "0.1", "--per-token", "0.02", "--json", str(out)],
                          cwd=root, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "interactive with the flood / alone" in done.stdout
    phases = json.loads(out.read_text())["results"]["vllm"]
    assert phases["interactive alone"]["interactive"]["latencies"]
    assert phases["batch alone"]["batch"]["latencies"]
    assert phases["both"]["interactive"]["latencies"] and phases["both"]["batch"]["latencies"]
    assert not phases["interactive alone"]["batch"]["statuses"]  # no flood when alone


# ------------------------------------------------------------------ deadline admission
def test_deadline_admission_answers_429_with_the_earliest_feasible_slo() -> None:
    """``scheduler.deadline_admission: reject``: a query whose predicted critical path is past
    its deadline is answered at once with the SLO that would be feasible, and that SLO, asked
    for, is admitted and answered (an idle cluster: nothing else moves the estimate)."""
    config = AgentFlowConfig(fewshot=None, pipeline="single",
                             scheduler={"deadline_admission": "reject",
                                        "admit_by_backlog": False})  # this check alone
    backend = ScriptedBackend(script, latency_s=0.01)
    with AgentFlow(config, backends={"cpu-0": backend}) as af, \
            LiveServer({}, {"api_keys": [KEYS["plain"]]}, agentflow=af) as live:
        tight = ask(live, "plain", slo_seconds=0.001)
        assert tight.status_code == 429, tight.text
        err = error_of(tight)
        assert err["code"] == "would_miss_deadline", err
        assert err["earliest_slo_s"] > 0.001 and "would be feasible" in err["message"]
        assert int(tight.headers["retry-after"]) >= 1
        assert backend.calls == []  # refused before any call was made
        view = httpx.get(f"{live.url}/v1/queries/{err['query_id']}",
                         headers={"Authorization": f"Bearer {KEYS['plain']}"}).json()
        assert view["status"] == "rejected"
        roomy = ask(live, "plain", slo_seconds=max(1.0, 2 * err["earliest_slo_s"]))
        assert roomy.status_code == 200 and roomy.json()["status"] == "done", roomy.text


def test_deadline_admission_is_off_by_default() -> None:
    assert AgentFlowConfig().scheduler.deadline_admission is None
    with pytest.raises(ValueError, match="deadline_admission"):
        AgentFlowConfig.model_validate({"scheduler": {"deadline_admission": "maybe"}})


def test_serving_classes_puts_the_flooding_key_in_the_class_asked() -> None:
    """``--flood-class interactive``: the two keys are tenants of one class (the fairness
    case in serving), in a config the server accepts, with preemption ``fair``."""

    from agentflow.bench.serving import serving_classes

    args = serving_classes.parser().parse_args(["--flood-class", "interactive"])
    config = serving_classes.server_config(args, "flowsage", "fair")
    tenants = {t["name"]: t["slo_class"] for t in config["server"]["tenants"]}
    assert tenants == {"page": "interactive", "evalrun": "interactive"}
    assert AgentFlowConfig.model_validate(
        {k: v for k, v in config.items() if k != "server"}).scheduler.preemption == "fair"
    default = serving_classes.server_config(serving_classes.parser().parse_args([]), "vllm")
    assert {t["slo_class"] for t in default["server"]["tenants"]} == {"interactive", "batch"}
