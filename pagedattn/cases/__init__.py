"""Case generators: the named grid per profile, hypothesis strategies, save/load."""

from pagedattn.cases.grid import BLOCK_SIZES, DTYPES, FAMILIES, HEAD_DIMS, PROFILES, grid
from pagedattn.cases.io import load_case, save_case
from pagedattn.cases.spec import DTYPE_NAMES, LAYOUTS, CaseSpec

__all__ = [
    "BLOCK_SIZES",
    "DTYPES",
    "DTYPE_NAMES",
    "FAMILIES",
    "HEAD_DIMS",
    "LAYOUTS",
    "PROFILES",
    "CaseSpec",
    "grid",
    "load_case",
    "save_case",
]
