"""Stand-in for the sglang package (tests/standins/README.md): not SGLang."""

__version__ = "standin"
