"""``python -m agentflow.bench NAME [ARGS]``: the same as ``agentflow bench NAME [ARGS]``."""

import sys

from agentflow.cli.main import main

sys.exit(main(["bench", *sys.argv[1:]]))
