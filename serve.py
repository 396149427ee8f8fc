#!/usr/bin/env python3
"""Start agentflow as a service: ``python serve.py`` (embedded default, demo database).

Options: ``--host``, ``--port``, ``--data DIR`` (Spider/BIRD databases), ``--config FILE``
(a real cluster); ``python serve.py --help`` lists them. Same as ``agentflow serve``.
"""

import sys

from agentflow.cli.serve import main

if __name__ == "__main__":
    sys.exit(main())
