"""The ablation queues live in ``agentflow/bench/`` and join the registry only when a benchmark
registers them; the product's policy names and ``--help`` list the shipped queues alone."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from agentflow.bench.scheduler.ablation_queues import ABLATION_QUEUES, register_ablation_queues
from agentflow.scheduler import policies
from agentflow.scheduler.policies import parse_policy, register_queue, resolve
from agentflow.scheduler.policies.queue_fcfs import FcfsQueue
from tests.scheduler.utils import chain_run, coordinator, occupy

ROOT = Path(__file__).resolve().parents[2]

SHIPPED = ["fcfs", "edf", "llf", "urgency", "gittins", "flowsage"]


@pytest.fixture
def ablations(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ablation queues registered for one test, the registry restored after it."""
    monkeypatch.setattr(policies, "QUEUE", dict(policies.QUEUE))
    register_ablation_queues()


def test_the_product_registry_holds_only_the_shipped_queues() -> None:
    assert list(policies.QUEUE) == SHIPPED
    with pytest.raises(ValueError, match="unknown queue policy 'flowsage_v1'"):
        parse_policy("least_loaded+flowsage_v1")


def test_simulate_help_lists_only_shipped_queues() -> None:
    out = subprocess.run([sys.executable, "-m", "agentflow", "simulate", "--help"],
                         capture_output=True, text=True, check=True, cwd=ROOT).stdout
    text = " ".join(out.split())  # argparse wraps lines
    assert "queue in " + ", ".join(SHIPPED) + ";" in text
    for name in ABLATION_QUEUES:
        assert name not in text


@pytest.mark.usefixtures("ablations")
def test_registered_ablations_resolve_under_their_own_names() -> None:
    for name in ABLATION_QUEUES:
        _, queue = resolve(f"least_loaded+{name}")
        assert queue.name == name
    register_ablation_queues()  # the same factories again: a no-op
    assert list(policies.QUEUE) == SHIPPED + list(ABLATION_QUEUES)


@pytest.mark.usefixtures("ablations")
def test_register_queue_refuses_taken_and_malformed_names() -> None:
    with pytest.raises(ValueError, match="'fcfs' is already registered"):
        register_queue("fcfs", ABLATION_QUEUES["query_srpt"])
    register_queue("fcfs", FcfsQueue)  # the factory it already has: fine
    for bad in ("", "a+b", "x@oracle", "a,b", "a b"):
        with pytest.raises(ValueError, match="bad queue policy name"):
            register_queue(bad, FcfsQueue)
    assert list(policies.QUEUE) == SHIPPED + list(ABLATION_QUEUES)


@pytest.mark.usefixtures("ablations")
def test_flowsage_v1_runs_at_risk_calls_first_then_the_query_with_least_work_left() -> None:
    # Short: one 2 s stage left, deadline 100 -> not at risk; remaining cost 2^2/2 = 2.
    # Long:  stages 2, 50, 50 left, deadline 1000 -> not at risk; remaining cost 2 + 1250*2.
    # Late:  one 5 s stage, deadline 3: budget 3 < t = 5 -> at risk (urgency 2): runs first.
    lengths = {"s1": 2, "l1": 2, "l2": 50, "l3": 50, "x1": 5}
    c = coordinator("least_loaded+flowsage_v1", lengths)
    occupy(c)
    c.on_query_arrival("Long", deadline=1000, run=chain_run("Long", 1000, ["l1", "l2", "l3"]))
    c.on_query_arrival("Short", deadline=100, run=chain_run("Short", 100, ["s1"]))
    c.on_query_arrival("Late", deadline=3, run=chain_run("Late", 3, ["x1"]))
    c.on_call_ready("Long", stage="l1", node_id="Long.0", prompt_tokens=0)
    c.on_call_ready("Short", stage="s1", node_id="Short.0", prompt_tokens=0)
    c.on_call_ready("Late", stage="x1", node_id="Late.0", prompt_tokens=0)
    order = [x.query.id for x in c.queues["fast"].ordered_waiting(0.0, c)]
    assert order == ["Late", "Short", "Long"]
    assert c.remaining_cost(c.queries["Long"]).mean() == pytest.approx(2 + 1250 + 1250)
    # its Gittins half alone ignores the deadline: Short (cost 2) before Late (cost 12.5)
    c = coordinator("least_loaded+query_gittins", lengths)
    occupy(c)
    c.on_query_arrival("Late", deadline=3, run=chain_run("Late", 3, ["x1"]))
    c.on_query_arrival("Short", deadline=100, run=chain_run("Short", 100, ["s1"]))
    c.on_call_ready("Late", stage="x1", node_id="Late.0", prompt_tokens=0)
    c.on_call_ready("Short", stage="s1", node_id="Short.0", prompt_tokens=0)
    assert [x.query.id for x in c.queues["fast"].ordered_waiting(0.0, c)] == ["Short", "Late"]
