"""Does a lone llama-server request slow down as the server's history grows?

    agentflow bench rvs_kvstate --cluster FILE [--rounds 12] [--json FILE]

Why: in the 30-query replays, calls alone on their server ran 1.06x their simulated time in
the first half of the run and 1.25x in the second, while single-request probes on a fresh
server before and after read 0.92-1.18. Two things in llama-server grow with its history:
the KV cells an idle slot keeps for prompt-cache reuse (a decode's attention spans the cells
in use of its stream, ``llama_kv_cache::get_n_kv``), and the host-RAM prompt cache
(``--cache-ram``, 8 GiB by default): on every new task the server copies each idle slot's
whole state into it (``cache_idle_slots``, ``server_prompt_cache::alloc``) on the thread that
also runs the batch. This runs, on every instance of the cluster file at once, rounds of one
fixed probe request followed by a workload-like mix of calls (two at a time), and prints per
round the probe's decode and prompt milliseconds per token, its wall time over the server's
own timings (what the server did outside them) and the server's resident memory; at the end
it erases every slot (``POST /slots/K?action=erase``) and probes again. Give two instances
different ``cache_ram`` (agentflow's default 0 on one, e.g. 1024 MiB on the other) to compare
them in the same minutes; swap them in a second run to cancel the cores' own difference.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from agentflow.bench.fidelity.real_vs_sim import (
    PromptMaker,
    close_all,
    start_backends,
    tokenizer_of,
)

# (prompt, output) shapes of the replays' calls, by their quarters of time (calibrate-first)
MIX = ((65, 2), (601, 8), (809, 52), (1196, 84), (601, 8), (809, 52))
PROBE = (600, 48)


def rss_mib(pid: int | None) -> float:
    if pid is None:
        return float("nan")
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def completion(client: Any, url: str, prompt: str, n: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    r = await client.post(f"{url}/completion", json={
        "prompt": prompt, "n_predict": n, "ignore_eos": True, "temperature": 0.0},
        timeout=600)
    wall = time.perf_counter() - t0
    r.raise_for_status()
    body = r.json()
    t = body["timings"]
    return {"slot": body.get("id_slot"), "wall_ms": wall * 1000,
            "outside_ms": wall * 1000 - t["prompt_ms"] - t["predicted_ms"],
            "decode_ms_tok": t["predicted_per_token_ms"],
            "prompt_ms_tok": t["prompt_per_token_ms"], "cache_n": t.get("cache_n", 0)}


async def probe(client: Any, url: str, maker: PromptMaker, pid: int | None,
                label: str, row: dict[str, Any]) -> dict[str, Any]:
    got = await completion(client, url, maker.make(PROBE[0]), PROBE[1])
    got.update(row, phase=label, rss_mib=rss_mib(pid))
    return got


async def run_instance(name: str, backend: Any, maker: PromptMaker, rounds: int
                       ) -> list[dict[str, Any]]:
    import httpx

    url = backend.process.base_url
    pid = backend.process.pid
    rows = []
    async with httpx.AsyncClient() as client:
        await completion(client, url, maker.make(16), 2)  # warm-up
        for r in range(rounds):
            rows.append(await probe(client, url, maker, pid, "probe",
                                    {"instance": name, "round": r}))
            print(f"{name} round {r:2d}: decode {rows[-1]['decode_ms_tok']:.1f} ms/tok, "
                  f"prompt {rows[-1]['prompt_ms_tok']:.2f} ms/tok, outside "
                  f"{rows[-1]['outside_ms']:.0f} ms, rss {rows[-1]['rss_mib']:.0f} MiB",
                  flush=True)
            for i in range(0, len(MIX), 2):
                await asyncio.gather(*(completion(client, url, maker.make(p), o)
                                       for p, o in MIX[i:i + 2]))
        for slot in range(backend.slots):
            resp = await client.post(f"{url}/slots/{slot}?action=erase", timeout=60)
            if resp.status_code != 200:
                print(f"{name}: erase slot {slot} answered {resp.status_code}", flush=True)
        for k in range(3):
            rows.append(await probe(client, url, maker, pid, "after-erase",
                                    {"instance": name, "round": rounds + k}))
            print(f"{name} after erase: decode {rows[-1]['decode_ms_tok']:.1f} ms/tok, "
                  f"outside {rows[-1]['outside_ms']:.0f} ms, rss {rows[-1]['rss_mib']:.0f} MiB",
                  flush=True)
    return rows


async def run_all(backends: dict[str, Any], makers: dict[str, PromptMaker], rounds: int
                  ) -> list[dict[str, Any]]:
    parts = await asyncio.gather(*(run_instance(n, b, makers[n], rounds)
                                   for n, b in backends.items()))
    return [row for part in parts for row in part]


def summary(rows: list[dict[str, Any]]) -> None:
    for name in sorted({r["instance"] for r in rows}):
        mine = [r for r in rows if r["instance"] == name]
        probes = [r for r in mine if r["phase"] == "probe"]
        half = len(probes) // 2
        first = np.median([r["decode_ms_tok"] for r in probes[1:half]] or [np.nan])
        second = np.median([r["decode_ms_tok"] for r in probes[half:]])
        erased = np.median([r["decode_ms_tok"] for r in mine if r["phase"] == "after-erase"])
        out1 = np.median([r["outside_ms"] for r in probes[1:half]] or [np.nan])
        out2 = np.median([r["outside_ms"] for r in probes[half:]])
        print(f"{name}: probe decode ms/token fresh {probes[0]['decode_ms_tok']:.1f}, "
              f"first half {first:.1f}, second half {second:.1f}, after erase {erased:.1f}; "
              f"outside the server's timings {out1:.0f} -> {out2:.0f} ms; "
              f"rss {probes[0]['rss_mib']:.0f} -> {mine[-1]['rss_mib']:.0f} MiB")


# `agentflow bench NAME --quick`: a short run (registry.expand_quick)
QUICK_ARGS: tuple[str, ...] = ("--rounds", "3")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cluster", required=True)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    backends = start_backends(args.cluster)
    try:
        tok = tokenizer_of(backends, None)
        makers = {n: PromptMaker(tok, args.seed + i) for i, n in enumerate(backends)}
        rows = asyncio.run(run_all(backends, makers, args.rounds))
        for m in makers.values():
            m.close()
    finally:
        asyncio.run(close_all(backends))
    summary(rows)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
