"""Find and load a backend from ``--backend=...``.

Three routes: an entry-point name in the ``pagedattn.backends`` group; a module
path ``package.module:attr``; a file ``path/to/file.py:attr``. ``attr`` may be a
backend instance, a class, or a zero-argument factory.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
import traceback
from types import ModuleType
from typing import Any, cast

from pagedattn.adapters.capabilities import Capabilities
from pagedattn.adapters.exclusion import INVARIANCES
from pagedattn.adapters.protocol import Backend, SupportsGather, SupportsLse, SupportsWarmup, SupportsWriteCache
from pagedattn.runner.backend_spec import GROUP, available_backends  # noqa: F401  (GROUP: re-exported)


def _protocol_methods(protocol: type) -> tuple[str, ...]:
    """The methods a protocol of ``pagedattn.adapters.protocol`` declares (not inherited)."""
    return tuple(n for n, v in vars(protocol).items() if inspect.isfunction(v) and not n.startswith("_"))


#: the optional methods of the contract, named by their protocols: what ``backend_info``
#: reports and the isolated proxy forwards. Not here: ``SupportsOut`` (an argument of the
#: required ``paged_attention``, reported as ``accepts_out``) and ``SupportsClose`` (the
#: proxy closes its own child, and the child closes the backend).
OPTIONAL_METHODS = tuple(
    m for p in (SupportsGather, SupportsWriteCache, SupportsLse, SupportsWarmup) for m in _protocol_methods(p)
)


class BackendLoadError(Exception):
    """``--backend`` names nothing loadable; the message says why and what exists."""


def _cause(exc: BaseException) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip()


def _stopped(exc: BaseException, what: str) -> str:
    """What a ``SystemExit`` or another ``BaseException`` escaping ``what`` (importing,
    constructing) says in a usage error: a backend that ends the process there stops the run
    before any case, as one clear error, not pytest's internal error."""
    if isinstance(exc, SystemExit):
        return f"{what} exited with code {exc.code!r} (sys.exit)"
    return f"{what} raised {type(exc).__name__}:\n{_cause(exc)}"


def _import_file(path: str) -> ModuleType:
    """The module of ``path``, executed once per process: a second load of the same file
    (the header, the isolation child, ``python -m pagedattn``) reuses it, because importing
    a backend file runs its code."""
    name = "pagedattn_adapter_" + os.path.splitext(os.path.basename(path))[0]
    loaded = sys.modules.get(name)
    if loaded is not None and os.path.abspath(getattr(loaded, "__file__", "") or "") == os.path.abspath(path):
        return loaded
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise BackendLoadError(f"--backend: cannot import {path!r} as a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    # The file's own directory is importable while it loads, so an adapter split into a
    # file and its helper modules beside it imports them as it would run from there.
    directory = os.path.dirname(os.path.abspath(path))
    sys.path.insert(0, directory)
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]  # a failed import is retried, not half-reused
        raise
    finally:
        if directory in sys.path:
            sys.path.remove(directory)
    return module


def _instantiate(obj: Any, where: str) -> Backend:
    if isinstance(obj, type) or (callable(obj) and not hasattr(obj, "paged_attention")):
        try:
            obj = obj()
        except Exception as exc:
            raise BackendLoadError(f"--backend={where}: constructing the backend failed:\n{_cause(exc)}") from exc
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):
                raise
            raise BackendLoadError(f"--backend={where}: " + _stopped(exc, "constructing the backend")) from None
    missing = [a for a in ("name", "capabilities", "paged_attention") if not hasattr(obj, a)]
    if missing:
        raise BackendLoadError(
            f"--backend={where}: {type(obj).__name__} is not a backend: missing {', '.join(missing)} "
            "(see pagedattn.Backend)"
        )
    if not isinstance(obj.capabilities, Capabilities):
        raise BackendLoadError(
            f"--backend={where}: capabilities must be a pagedattn.Capabilities, got {type(obj.capabilities).__name__}"
        )
    if not callable(obj.paged_attention):
        raise BackendLoadError(f"--backend={where}: paged_attention is not callable")
    return cast(Backend, obj)  # the required part of the contract, checked above


def load_backend(spec: str) -> Backend:
    """The backend named by ``spec`` (see module docstring). Raises ``BackendLoadError``
    with the cause (an import failure's traceback, or the list of known names)."""
    if ":" in spec:
        where, attr = spec.rsplit(":", 1)
        try:
            if where.endswith(".py") or os.sep in where or "/" in where:
                if not os.path.exists(where):
                    raise BackendLoadError(f"--backend={spec}: file {where!r} does not exist")
                module = _import_file(where)
            else:
                module = importlib.import_module(where)
        except BackendLoadError:
            raise
        except Exception as exc:
            raise BackendLoadError(f"--backend={spec}: importing {where!r} failed:\n{_cause(exc)}") from exc
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):
                raise
            raise BackendLoadError(f"--backend={spec}: " + _stopped(exc, f"importing {where!r}")) from None
        if not hasattr(module, attr):
            raise BackendLoadError(f"--backend={spec}: {where!r} has no attribute {attr!r}")
        return _instantiate(getattr(module, attr), spec)
    known = available_backends()
    if spec not in known:
        names = ", ".join(sorted(known)) or "(none installed)"
        raise BackendLoadError(
            f"--backend={spec}: unknown backend. Available: {names}. "
            "Or give package.module:attr or path/to/file.py:attr."
        )
    try:
        obj = known[spec].load()
    except Exception as exc:
        raise BackendLoadError(
            f"--backend={spec}: loading entry point {known[spec].value!r} failed:\n{_cause(exc)}"
        ) from exc
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        what = f"loading entry point {known[spec].value!r}"
        raise BackendLoadError(f"--backend={spec}: " + _stopped(exc, what)) from None
    return _instantiate(obj, spec)


# ------------------------------------------------------------ a loaded backend
def accepts_out(backend: Backend) -> bool:
    """Whether ``backend.paged_attention`` takes ``out=``: its ``accepts_out`` attribute, else
    its signature."""
    explicit = getattr(backend, "accepts_out", None)
    if explicit is not None:
        return bool(explicit)
    try:
        return "out" in inspect.signature(backend.paged_attention).parameters
    except (TypeError, ValueError):
        return False


def backend_info(backend: Backend) -> dict[str, Any]:
    """What the suite and the report need to know of a backend, as plain data (it crosses
    process boundaries: from the isolation child, from xdist workers)."""
    caps = backend.capabilities
    return {
        "name": str(backend.name),
        "version": str(getattr(backend, "version", "") or ""),
        "target": getattr(backend, "target", None),
        "capabilities": caps.describe(),
        "limit_lines": list(caps.limit_lines()),
        "invariances": {n: caps.invariance_reason(n) for n in sorted(INVARIANCES)},
        "notes": dict(caps.notes),
        "dtypes": [str(d).replace("torch.", "") for d in caps.dtypes],
        "operations": sorted(caps.operations),
        "variants": sorted(caps.variants),
        "devices": sorted(caps.devices),
        "fp32_precision": caps.fp32_precision,
        "qk_precision": caps.qk_precision,
        "tanh_precision": caps.tanh_precision,
        "partials_precision": getattr(caps, "partials_precision", "fp32"),
        "declared_on": getattr(caps, "declared_on", "all"),
        "tolerance_factor": caps.tolerance_factor,
        "max_seq_len": caps.max_seq_len,
        "decode_only": caps.decode_only,
        "default_scale_only": caps.default_scale_only,
        "methods": [m for m in OPTIONAL_METHODS if callable(getattr(backend, m, None))],
        "accepts_out": accepts_out(backend),
    }
