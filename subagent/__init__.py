"""subagent-runtime: let an LLM agent delegate work to child agents and keep control of them."""
