"""ibex-context where agents already are: a LiteLLM proxy hook (``litellm_hook``) and the memory
API as MCP tools (``mcp_server``). Both are built on the clients (``ibex_context.client``) and the
generated messages only, never on the server's modules."""
