"""The canonical case, the float64 oracle and the tolerance policy."""

from pagedattn.oracle.bitexact import BitCheck, bits_equal, check_bitexact
from pagedattn.oracle.case import PagedCase
from pagedattn.oracle.error_model import DTYPE_TABLE, WARN_FACTOR
from pagedattn.oracle.policy import PRECISIONS, QK_PRECISIONS, TANH_PRECISIONS, attention_error_bound
from pagedattn.oracle.reference import (
    causal_mask,
    gather_history,
    kv_row_scales,
    paged_attention_reference,
    paged_attention_reference_lse,
    paged_gather,
    write_cache_by_indexing,
)
from pagedattn.oracle.verdict import AttentionCheck, check_attention, check_attention_lse
from pagedattn.validation import (
    FP8_DTYPES,
    HEAD_DIM_V,
    MLA,
    PER_HEAD_SCALES,
    SHAPE_VARIANTS,
    TREE_MASK,
    VARIANTS,
    ProblemError,
)

__all__ = [
    "DTYPE_TABLE",
    "PRECISIONS",
    "QK_PRECISIONS",
    "TANH_PRECISIONS",
    "WARN_FACTOR",
    "AttentionCheck",
    "BitCheck",
    "FP8_DTYPES",
    "HEAD_DIM_V",
    "MLA",
    "PER_HEAD_SCALES",
    "SHAPE_VARIANTS",
    "TREE_MASK",
    "PagedCase",
    "ProblemError",
    "VARIANTS",
    "attention_error_bound",
    "bits_equal",
    "causal_mask",
    "check_attention",
    "check_attention_lse",
    "check_bitexact",
    "gather_history",
    "kv_row_scales",
    "paged_attention_reference",
    "paged_attention_reference_lse",
    "paged_gather",
    "write_cache_by_indexing",
]
