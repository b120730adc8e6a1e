"""The Triton kernel's host side under one name: the input checks (``checks``), the launch
plan (``launch_plan``, ``decode_splits``) and the tuning (``tuning``), for callers that
import ``pagedattn.kernels.host``. Nothing here imports triton."""

from pagedattn.kernels.checks import (
    INT32_MAX,
    OWNER,
    QUERY_DTYPES,
    Variants,
    check_paged_inputs,
    check_variants,
    fits_int32,
    last_offset,
)
from pagedattn.kernels.decode_splits import decode_fold, decode_launch_shape, decode_split, decode_work
from pagedattn.kernels.launch_plan import (
    GRID_YZ_MAX,
    MIN_DOT,
    LaunchConfig,
    LaunchPlan,
    decode_block_n,
    decode_grid,
    fp8_widening,
    plan_launch,
)
from pagedattn.kernels.tuning import TUNING, KernelTuning

__all__ = [
    "GRID_YZ_MAX",
    "INT32_MAX",
    "MIN_DOT",
    "OWNER",
    "QUERY_DTYPES",
    "TUNING",
    "KernelTuning",
    "LaunchConfig",
    "LaunchPlan",
    "Variants",
    "check_paged_inputs",
    "check_variants",
    "decode_block_n",
    "decode_fold",
    "decode_grid",
    "decode_launch_shape",
    "decode_split",
    "decode_work",
    "fits_int32",
    "fp8_widening",
    "last_offset",
    "plan_launch",
]
