"""`python -m subagent.cli` is the `subagent` command."""

import sys

from subagent.cli import main

sys.exit(main())
