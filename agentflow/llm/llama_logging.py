"""llama.cpp's log lines, silenced unless asked for.

llama.cpp reports model loading and context set-up (``llama_kv_cache_iswa: using full-size SWA
cache ...``, ``llama_context: ...``) through a log callback; llama-cpp-python's default
callback prints some of them to stderr whatever ``verbose`` says, which clutters every
command and breaks the CLI's spinner. We install our own callback once: it hands each line to
the Python logger ``agentflow.llama`` (level mapped from ggml's), and that logger is off by
default. ``set_llama_verbose(True)`` (the CLI's ``--verbose``) prints them to stderr.
"""

from __future__ import annotations

import logging
import sys
import threading
from typing import Any

log = logging.getLogger("agentflow.llama")
log.propagate = False
log.setLevel(logging.CRITICAL + 1)  # off
log.addHandler(logging.NullHandler())

# ggml_log_level: 0 none, 1 debug, 2 info, 3 warn, 4 error, 5 cont (continues the last line)
_LEVELS = {0: logging.INFO, 1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING,
           4: logging.ERROR}
_lock = threading.Lock()
_state: dict[str, Any] = {"callback": None, "last": logging.INFO, "handler": None}


def install() -> None:
    """Route llama.cpp's log through ``agentflow.llama`` (idempotent; no-op without
    llama-cpp-python). Call before loading a model."""
    with _lock:
        if _state["callback"] is not None:
            return
        try:
            import llama_cpp.llama_cpp as C
        except ImportError:
            return

        @C.llama_log_callback
        def callback(level, text, user_data):  # noqa: ARG001 - ctypes signature
            try:
                level = int(level)
                py_level = _state["last"] if level == 5 else _LEVELS.get(level, logging.INFO)
                _state["last"] = py_level
                if log.isEnabledFor(py_level):
                    log.log(py_level, "%s", text.decode("utf-8", errors="replace").rstrip("\n"))
            except Exception:  # noqa: BLE001 - never raise into C
                pass

        C.llama_log_set(callback, None)
        _state["callback"] = callback  # keep a reference: C holds only the pointer


def set_llama_verbose(verbose: bool) -> None:
    """Print llama.cpp's log lines to stderr (True) or drop them (False, the default)."""
    install()
    with _lock:
        if verbose and _state["handler"] is None:
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter("llama.cpp: %(message)s"))
            log.addHandler(handler)
            _state["handler"] = handler
        log.setLevel(logging.DEBUG if verbose else logging.CRITICAL + 1)


def quiet_llama(quiet: bool = True) -> None:
    """The CLI's switch: ``quiet_llama(not args.verbose)``."""
    set_llama_verbose(not quiet)
