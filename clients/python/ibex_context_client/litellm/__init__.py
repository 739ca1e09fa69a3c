"""The LiteLLM proxy hook (``hook.proxy_hook``): the ``litellm`` extra.

LiteLLM itself comes with the proxy, at its own pins."""
