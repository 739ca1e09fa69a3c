"""ibex-context: context assembly for LLM agents.

The request path, one module per stage (``ibex_context.pipeline``):
budget -> retrieval (directive, hot, embed, cold; each under its own deadline)
-> scoring -> packing -> formatting, orchestrated by ``pipeline.assembler``.
"""

__version__ = "0.1.0"
