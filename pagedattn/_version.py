__version__ = "0.3.0"


def dist_version(dist: str) -> str:
    """An installed distribution's version from its metadata (importing nothing of it:
    importing triton here would fix TRITON_INTERPRET too early), or ``"not installed"``."""
    import importlib.metadata

    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"
