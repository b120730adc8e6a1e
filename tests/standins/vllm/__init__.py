"""Stand-in for the vllm package (tests/standins/README.md): not vLLM."""

__version__ = "standin"
