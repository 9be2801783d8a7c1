"""subagent."""
