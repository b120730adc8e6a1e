"""Stand-in: vLLM's ``KVQuantMode`` (the cache quantization modes ``unified_attention`` takes)."""

import enum


class KVQuantMode(enum.IntEnum):
    NONE = 0
    FP8_PER_TENSOR = 1
    INT8_PER_TOKEN_HEAD = 2
    FP8_PER_TOKEN_HEAD = 3
    INT4_PER_TOKEN_HEAD = 4
    INT2_PER_TOKEN_HEAD = 5
