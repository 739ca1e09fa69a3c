"""The memory API as MCP tools (``server``): the ``mcp`` extra."""
