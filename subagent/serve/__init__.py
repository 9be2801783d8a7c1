"""Serving the runtime to other agents over stdio: `subagent mcp` and `subagent acp`.

- `subagent.serve.mcp_server`: an MCP server whose tools are the model-facing subagent tools,
  called on behalf of one root agent per connection.
- `subagent.serve.acp_agent`: the runtime as an ACP agent; each ACP session is a coordinator
  agent with the subagent tools.
- What they share: `stdio` (the protocol owns fd 1, everything else goes to stderr), `wiring`
  (a runtime and its providers from flags or a config file), `offline` (the embedded scripted
  model that makes both work with no network and no keys), `progress` (child events as text).

Both reuse `providers.acp_rpc.JsonRpcConnection`, the project's gevent JSON-RPC peer. See
docs/serve.md.
"""
