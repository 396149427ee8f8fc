"""Call deadlines read an untried instance's peers from a cache kept per GPU and model, and
give the limits the scan over every instance gave.

``ScanDeadlines`` keeps ``time_model`` and ``speed_factor`` as they were (a scan of every
instance's model at every read). On the seeded event replay of ``test_view_rows`` over the
peer-group cluster (untried members beside answered ones throughout), after every event, both
give every instance the same model ratios and speed factor, and every running call the same
limit; and re-reading limits without a learn in between reads no instance's model again.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from agentflow.scheduler import Coordinator
from agentflow.scheduler.call import CallState
from agentflow.scheduler.call_deadline import CallDeadlines, _clamp, _quantile
from agentflow.scheduler.health import HealthSettings
from agentflow.workflow import ManualClock
from tests.scheduler.test_view_rows import PEER_SPECS, replay


class ScanDeadlines(CallDeadlines):
    """``time_model`` and ``speed_factor`` before the per-(GPU, model) cache, verbatim."""

    def time_model(self, instance):
        models = self.coordinator.time_models
        model = models[instance]
        if model.observations:
            return model
        spec = self.coordinator.queues[instance].spec
        peers = [models[n] for n, q in self.coordinator.queues.items()
                 if n != instance and models[n].observations
                 and (q.spec.gpu, q.spec.model) == (spec.gpu, spec.model)]
        if not peers:
            return model
        return replace(model, prefill_ratio=max(p.prefill_ratio for p in peers),
                       decode_ratio=max(p.decode_ratio for p in peers))

    def speed_factor(self, instance):
        q = self.settings.deadline_speed_quantile
        if q is None:
            return 1.0
        models = self.coordinator.time_models
        ratios = list(models[instance].call_ratios)
        if not ratios:
            spec = self.coordinator.queues[instance].spec
            peers = [sorted(models[n].call_ratios) for n, qu in self.coordinator.queues.items()
                     if n != instance and models[n].call_ratios
                     and (qu.spec.gpu, qu.spec.model) == (spec.gpu, spec.model)]
            return max((_clamp(_quantile(r, q), self.settings.deadline_speed_cap)
                        for r in peers), default=1.0)
        return _clamp(_quantile(sorted(ratios), q), self.settings.deadline_speed_cap)


@pytest.mark.parametrize("settings", [HealthSettings(deadline_min_s=0.01),
                                      HealthSettings(deadline_speed_quantile=0.5,
                                                     deadline_speed_cap=2.0)])
def test_cached_peers_give_the_limits_of_the_scan(settings):
    pairs: dict[int, tuple[CallDeadlines, CallDeadlines]] = {}
    compared = {"borrowing": 0, "limits": 0}

    def check(c: Coordinator) -> None:
        new, old = pairs.setdefault(id(c), (CallDeadlines(c, settings),
                                            ScanDeadlines(c, settings)))
        for name in c.queues:
            a, b = new.time_model(name), old.time_model(name)
            assert (a.prefill_ratio, a.decode_ratio) == (b.prefill_ratio, b.decode_ratio)
            assert new.speed_factor(name) == old.speed_factor(name)
            compared["borrowing"] += not c.time_models[name].observations and \
                b is not c.time_models[name]
        for q in c.queries.values():
            for call in sorted(q.calls, key=lambda x: x.seq):
                if call.state == CallState.RUNNING and call.instance is not None:
                    started = call.started_at or 0.0
                    assert new.limit_s(call, call.instance, started) == \
                        old.limit_s(call, call.instance, started)
                    compared["limits"] += 1

    replay(Coordinator, "flowsage", seed=11, events=300, specs=PEER_SPECS, check=check)
    assert compared["borrowing"] > 200 and compared["limits"] > 500, compared


def test_reading_limits_again_reads_no_model_of_another_instance():
    c = Coordinator(PEER_SPECS, clock=ManualClock(0.0), policy="vllm")
    d = CallDeadlines(c, HealthSettings(deadline_min_s=0.01))
    c.on_query_arrival("q", deadline=None)
    calls = [c.on_call_ready("q", stage="revise", node_id=f"n{i}", prompt_tokens=900)[0]
             for i in range(len(PEER_SPECS))]
    done = next(x for x in calls if x.instance == "a100-0")
    c.on_call_done(done, output_tokens=50, ttft_s=0.5, total_s=3.0)  # one peer answered
    untried = [x for x in calls if x.state == CallState.RUNNING
               and x.instance.startswith("a100-")
               and not c.time_models[x.instance].observations]
    assert untried
    for x in untried:  # the first reads fill the cache
        d.limit_s(x, x.instance, 0.0)
    models, reads = c.time_models, []

    class Counting(type(models)):
        def __getitem__(self, name):
            reads.append(name)
            return super().__getitem__(name)

    c.time_models = Counting(c, dict(models))
    # (an attribute set, not a model replaced: the same model objects, no epoch moved)
    for _ in range(20):
        for x in untried:
            d.limit_s(x, x.instance, 0.0)
    assert set(reads) <= {x.instance for x in untried}  # each its own model, no peer's
    models_before = len(reads)
    c.on_call_done(untried[0], output_tokens=50, ttft_s=0.5, total_s=9.0)  # a peer learns
    d.limit_s(untried[1], untried[1].instance, 0.0)
    assert len(reads) > models_before + 1  # the peers were read again
    assert d.time_model(untried[1].instance).decode_ratio == max(
        c.time_models[n].decode_ratio for n in ("a100-0", untried[0].instance))
