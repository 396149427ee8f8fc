"""One log format for the server: agentflow's lines and uvicorn's look alike.

uvicorn brings its own formatters ("INFO:     127.0.0.1:5000 - ..."), agentflow used
``logging.basicConfig``'s; side by side they read as two programs. ``log_config`` returns the
dictConfig uvicorn applies at start-up, covering ``uvicorn.*``, ``agentflow.*`` and the root
logger with one formatter. The access log drops the web page's own polling (successful GETs of
the instance list, the recent-query list, a query's status, static files), which otherwise
writes a line every two seconds per open page; every other request is still logged.
"""

from __future__ import annotations

import logging
import re
from typing import Any

FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"
DATE_FORMAT = "%Y-%m-%d %H:%M:%S"

# GET paths the page polls; logged only when they fail.
_POLLED = re.compile(r"^/(v1/instances|v1/queries(\?.*)?|v1/queries/[\w-]+|static/.*|"
                     r"healthz|favicon\.ico)?$")


class PollingFilter(logging.Filter):
    """Drop successful polling GETs from uvicorn's access log."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if not isinstance(args, tuple) or len(args) < 5:
            return True
        _, method, path, _, status = args[:5]
        try:
            ok = int(str(status)) < 400
        except (TypeError, ValueError):
            return True
        return not (method == "GET" and ok and _POLLED.match(str(path)))


def log_config(level: str = "info") -> dict[str, Any]:
    level = level.upper()
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"polling": {"()": PollingFilter}},
        "formatters": {
            "default": {"format": FORMAT, "datefmt": DATE_FORMAT},
            "access": {"()": "uvicorn.logging.AccessFormatter", "use_colors": False,
                       "fmt": "%(asctime)s %(levelname)-7s %(name)s: %(client_addr)s "
                              '"%(request_line)s" %(status_code)s',
                       "datefmt": DATE_FORMAT},
        },
        "handlers": {
            "default": {"class": "logging.StreamHandler", "formatter": "default",
                        "stream": "ext://sys.stderr"},
            "access": {"class": "logging.StreamHandler", "formatter": "access",
                       "filters": ["polling"], "stream": "ext://sys.stderr"},
        },
        "loggers": {
            "uvicorn": {"handlers": ["default"], "level": level, "propagate": False},
            "uvicorn.error": {"level": level},
            "uvicorn.access": {"handlers": ["access"], "level": level, "propagate": False},
            "agentflow": {"handlers": ["default"], "level": level, "propagate": False},
        },
        "root": {"handlers": ["default"], "level": "WARNING"},
    }


def configure(level: str = "info") -> None:
    """Apply the same configuration before uvicorn starts (start-up lines of agentflow)."""
    import logging.config

    logging.config.dictConfig(log_config(level))
