"""`python -m subagent` is the `subagent` command."""

import sys

from subagent.cli import main

sys.exit(main())
