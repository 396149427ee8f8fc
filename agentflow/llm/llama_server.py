"""Run llama-cpp-python's OpenAI-compatible server with the extra-buffer-types workaround.

Why: ``python -m llama_cpp.server`` has no option for ``use_extra_bufts`` and crashes at the
first request on CPUs whose AMX kernels fault (see ``llama_loading``). This launcher patches
model loading for the whole process, then starts the same server with the same arguments::

    python -m agentflow.llm.llama_server --model PATH --host 127.0.0.1 --port 8080 --n_ctx 4096

Add ``--use-extra-bufts`` to keep llama.cpp's default. Needs the server dependencies
(fastapi, uvicorn, sse-starlette, starlette-context, pydantic-settings).
"""

from __future__ import annotations

import sys

from agentflow.llm.llama_loading import disable_extra_bufts_globally

_FLAG = "--use-extra-bufts"


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if _FLAG in args:
        args.remove(_FLAG)
    else:
        disable_extra_bufts_globally()
    try:
        from llama_cpp.server.__main__ import main as server_main
    except ImportError as exc:
        raise SystemExit(
            f"llama.cpp server dependencies are missing ({exc}); install fastapi uvicorn "
            "sse-starlette starlette-context pydantic-settings") from exc
    sys.argv = [sys.argv[0], *args]
    server_main()


if __name__ == "__main__":
    main()
