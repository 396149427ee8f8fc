"""Does a llama-server decode step cost depend on WHICH slots are decoding?

    agentflow bench rvs_slots --cluster examples/cluster-llama-server-2cpu.yaml \\
        [--repeats 3] [--output 48] [--json FILE]

Why: with one KV stream per slot (agentflow starts llama-server with ``--no-kv-unified``)
llama.cpp cuts a batch into ubatches with ``split_equal(sequential=true)``, which puts only
consecutive sequence ids in one ubatch (``llama-batch.cpp``); each ubatch is its own forward
pass over all the weights. If so, two requests decoding in slots 0 and 1 share one pass per
step, in slots 0 and 2 they take two, and the server's least-recently-used slot choice
makes the second common in a replay. This pins requests to slots (``id_slot``) on the
first instance of the cluster file and prints each pair's decode milliseconds per token
against a lone request's of the same minute, so the machine's drift cancels.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

import numpy as np

from agentflow.bench.fidelity.real_vs_sim import (
    PromptMaker,
    close_all,
    sim_engines,
    start_backends,
    tokenizer_of,
)

PAIRS = ((0, 1), (0, 2), (1, 2), (0, 3), (2, 3))


async def completion(client: Any, url: str, prompt: str, n: int, slot: int) -> dict[str, Any]:
    r = await client.post(f"{url}/completion", json={
        "prompt": prompt, "n_predict": n, "ignore_eos": True, "id_slot": slot,
        "cache_prompt": False, "temperature": 0.0}, timeout=600)
    r.raise_for_status()
    body = r.json()
    return {"slot": body.get("id_slot", body.get("slot_id")), **body["timings"]}


async def measure(url: str, maker: PromptMaker, repeats: int, prompt: int, output: int
                  ) -> list[dict[str, Any]]:
    import httpx

    rows = []
    async with httpx.AsyncClient() as client:
        await completion(client, url, maker.make(16), 2, 0)  # warm-up
        for _ in range(repeats):
            for a, b in PAIRS:
                lone = await completion(client, url, maker.make(prompt), output, 0)
                pa, pb = await asyncio.gather(
                    completion(client, url, maker.make(prompt), output, a),
                    completion(client, url, maker.make(prompt), output, b))
                lone2 = await completion(client, url, maker.make(prompt), output, 3)
                ref = (lone["predicted_per_token_ms"] + lone2["predicted_per_token_ms"]) / 2
                pair = (pa["predicted_per_token_ms"] + pb["predicted_per_token_ms"]) / 2
                rows.append({"slots": [a, b], "served": [pa["slot"], pb["slot"]],
                             "pair_ms": pair, "lone_ms": ref, "ratio": pair / ref})
                print(f"  slots {a},{b} (served {pa['slot']},{pb['slot']}): decode "
                      f"{pair:.1f} ms/token vs lone {ref:.1f} (ratio {pair / ref:.3f})",
                      flush=True)
    return rows


def simulated_ratio(cluster: str, pair: tuple[int, int], prompt: int, output: int) -> float:
    """The simulator's pair / lone decode step at the mean context of the decode, from the
    first instance's profile (agentflow.sim.llama_batches)."""
    from agentflow.llm.llama_batches import Piece
    from agentflow.sim.llama_batches import iteration_seconds

    engine = next(iter(sim_engines(cluster).values()))
    ctx = prompt + output // 2
    lone = iteration_seconds(engine.ops, [Piece(pair[0], 1, ctx, True, True)],
                             engine.n_ubatch)
    both = iteration_seconds(engine.ops, [Piece(s, 1, ctx, True, True) for s in pair],
                             engine.n_ubatch)
    return both / lone


# `agentflow bench NAME --quick`: a short run (registry.expand_quick)
QUICK_ARGS: tuple[str, ...] = ("--repeats", "1")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cluster", required=True)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--output", type=int, default=48)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    backends = start_backends(args.cluster)
    try:
        name, backend = next(iter(backends.items()))
        if backend.slots < 4:
            raise SystemExit(f"{name}: needs 4 slots, has {backend.slots}")
        maker = PromptMaker(tokenizer_of(backends, None), args.seed)
        rows = asyncio.run(measure(backend.process.base_url, maker, args.repeats,
                                   args.prompt, args.output))
        maker.close()
    finally:
        asyncio.run(close_all(backends))
    for pair in PAIRS:
        got = [r["ratio"] for r in rows if tuple(r["slots"]) == pair]
        print(f"slots {pair[0]},{pair[1]}: pair / lone decode per token, median "
              f"{np.median(got):.3f} over {len(got)}; simulated "
              f"{simulated_ratio(args.cluster, pair, args.prompt, args.output):.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
