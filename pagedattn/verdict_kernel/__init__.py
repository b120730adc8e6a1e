"""The check's bound and verdict as Triton kernels on a GPU: the same numbers as the
torch path of ``pagedattn.oracle.policy`` and ``pagedattn.oracle.verdict``, in one launch
a block of rows. Torch-free and triton-free at import: the report header asks
``triton_problem`` on a process that has neither loaded."""

from __future__ import annotations

from pagedattn._version import dist_version

#: the verdict kernels loop over runtime bounds, which Triton's interpreter before 3.6 cannot
#: run; their compiled form is not tested there either, so an older Triton keeps the torch path
MIN_TRITON = (3, 6)


def triton_problem() -> str:
    """Why the verdict kernels cannot run with the installed Triton (``""`` when they can),
    read from its metadata without importing it."""
    version = dist_version("triton")
    if version == "not installed":
        return "triton is not installed"
    try:
        found = tuple(int(x) for x in version.split("+")[0].split(".")[:2])
    except ValueError:
        return ""  # a development build: tried as it is
    if found < MIN_TRITON:
        return f"triton {version} is older than {'.'.join(map(str, MIN_TRITON))}, which the verdict kernels need"
    return ""
