import sys

from agentflow.cli.main import main

sys.exit(main())
