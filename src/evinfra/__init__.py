"""evinfra: agent-adaptive LLM serving."""

__version__ = "0.1.0"
