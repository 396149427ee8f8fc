"""A private asyncio loop for the command-line tools that drive real engines from sync code.

The fidelity benches and host calibration run several ``run_until_complete`` calls on one
loop (probe, run, probe again) and then close it. Closing a loop does not finish what is
still on it: a streamed response whose generator was left half-read, or a task a timeout
abandoned, is destroyed with the loop, and Python prints "Task was destroyed but it is
pending!" at exit. ``asyncio.run`` cleans up first, but it owns one coroutine; ``asyncio.Runner``
(which would do both) needs Python 3.11 and the project supports 3.10. ``close_loop`` does
the cleanup ``asyncio.run`` does: cancel leftover tasks and let them finish, close async
generators, shut the default executor down, then close.
"""

from __future__ import annotations

import asyncio


def close_loop(loop: asyncio.AbstractEventLoop) -> None:
    """Finish what is left on a loop this code owns (not a running one), then close it; the
    loop is closed even when the cleanup itself fails."""
    try:
        _cancel_leftovers(loop)
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.run_until_complete(loop.shutdown_default_executor())
    finally:
        loop.close()


def _cancel_leftovers(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel every task still pending on ``loop`` and run the loop until each has handled
    its cancellation; a task that fails while doing so is reported through the loop's
    exception handler, as ``asyncio.run`` reports it."""
    left = [t for t in asyncio.all_tasks(loop) if not t.done()]
    if not left:
        return
    for task in left:
        task.cancel()
    loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
    for task in left:
        if task.cancelled():
            continue
        err = task.exception()
        if err is not None:
            loop.call_exception_handler({"message": "unhandled exception while a private "
                                                    "loop was closing", "exception": err,
                                         "task": task})
