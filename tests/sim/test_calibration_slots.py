"""Calibration rows with pinned slots: each batched or joined request runs in the slot the
simulator's fresh engine gives it (``host_calibration.SlotClients``), whatever slots the
server's least-recently-released rule would have picked after the rows before."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from agentflow.llm.llama_batches import SlotTable
from agentflow.sim import host_calibration as calib


class Server:
    """A fake llama-server backend with 4 slots: records the slot of every request."""

    slots = 4

    def __init__(self):
        self.log: list[tuple[int | None, int]] = []  # (pinned slot, prompt words)
        self.open_clients = 0

    async def _serve(self, slot, request):
        self.log.append((slot, len(request.prompt.split())))
        await asyncio.sleep(0.001)
        return SimpleNamespace(prompt_tokens=len(request.prompt.split()), ttft_s=0.001,
                               engine_timings={"predicted_per_token_ms": 1.0})

    async def generate(self, request, on_progress=None):
        return await self._serve(None, request)

    def pinned(self, slot):
        server = self
        server.open_clients += 1

        class Client:
            async def generate(self, request, on_progress=None):
                return await server._serve(slot, request)

            async def close(self):
                server.open_clients -= 1

        return Client()


class Maker:
    def make(self, n):
        return " ".join(["w"] * n)


def test_the_fresh_engines_slots_are_the_simulators():
    table = SlotTable(4)
    assert calib.fresh_slots(4, 2) == [table.take("a"), table.take("b")] == [3, 2]
    assert sorted(calib.fresh_slots(4, 4)) == [0, 1, 2, 3]


def test_batched_and_joined_rows_pin_every_request_to_the_fresh_engines_slots():
    server = Server()
    rows = asyncio.run(calib.measure_batched(server, Maker(), 1, cpu_clock=False))
    assert len(rows) == len(calib.CAL_BATCHES) * len(calib.CAL_BATCH_SHAPES)
    assert all(slot is not None for slot, _ in server.log)
    # each row: a lone request, the batch, a lone request, in the fresh engine's slots
    k = 0
    for b in calib.CAL_BATCHES:
        for _ in calib.CAL_BATCH_SHAPES:
            lone_before = server.log[k][0]
            batch = sorted(slot for slot, _ in server.log[k + 1:k + 1 + b])
            lone_after = server.log[k + 1 + b][0]
            assert (lone_before, lone_after) == (3, 3)
            assert batch == sorted(calib.fresh_slots(4, b))
            k += b + 2
    assert server.open_clients == 0  # every pinned client closed
    server.log.clear()
    asyncio.run(calib.measure_joined(server, Maker(), 1, cpu_clock=False))
    # per prompt: A alone, A + B joined (slots 3 and 2), B alone
    assert [slot for slot, _ in server.log] == [3, 3, 2, 3] * len(calib.CAL_JOIN_PROMPTS)
    assert server.open_clients == 0


def test_a_backend_without_slots_serves_every_request_itself():
    server = Server()
    remote = SimpleNamespace(generate=server.generate)  # no slots, no pinned clients
    asyncio.run(calib.measure_batched(remote, Maker(), 1, cpu_clock=False))
    assert {slot for slot, _ in server.log} == {None}
