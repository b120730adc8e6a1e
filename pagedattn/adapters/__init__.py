"""The adapter contract, backend loading, and the bundled backends (imported lazily)."""

from pagedattn.adapters.capabilities import Capabilities
from pagedattn.adapters.loading import GROUP, BackendLoadError, available_backends, load_backend
from pagedattn.adapters.protocol import Backend

__all__ = ["GROUP", "Backend", "BackendLoadError", "Capabilities", "available_backends", "load_backend"]
