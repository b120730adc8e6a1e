"""Stand-in package (tests/standins/README.md)."""
