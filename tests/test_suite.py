"""The suite's bookkeeping: one configuration (compile key) whether read from a grid spec or
from its built case, and one seeding scheme (a case's id, through ``case_seed``)."""

import zlib

import pytest
import torch

from pagedattn.cases import grid
from pagedattn.cases.configuration import Configuration
from pagedattn.cases.spec import CaseSpec, case_seed
from pagedattn.runner.case_record import OPERATIONS
from pagedattn.runner.properties import permute_blocks
from pagedattn.runner.suite import PLACEMENT_STREAM, case_configuration
from tests.asserts import assert_differs, assert_equal


@pytest.mark.parametrize("family", sorted({s.family for s in grid("quick")}))
def test_a_specs_configuration_is_its_built_cases(family):
    operation = OPERATIONS.get(family, "attention")
    for spec in grid("quick", family):
        config = Configuration.of_spec(spec)
        case = spec.build()
        assert config == Configuration.of_case(case), spec.id
        assert config.key(operation) == case_configuration(case, operation), spec.id
        assert config.all_variants == case.variants, spec.id
        assert config.gqa_ratio == case.gqa_ratio, spec.id


def test_the_compile_key_spells_dtypes_shape_variants_and_operation():
    spec = CaseSpec(
        "decode",
        ((40, 1),),
        num_heads=4,
        num_kv_heads=2,
        head_dim=64,
        block_size=16,
        dtype=torch.bfloat16,
        kv_dtype=torch.float8_e4m3fn,
        sinks=True,
        sliding_window=8,
    )
    assert Configuration.of_spec(spec).key("lse") == "bf16|kv=fp8_e4m3|d64|bs16|fp8_e4m3+sinks+sliding_window|lse"
    plain = CaseSpec("decode", ((40, 1),), num_heads=4, num_kv_heads=4, head_dim=80, block_size=13)
    assert Configuration.of_spec(plain).key("attention") == "fp32|kv=fp32|d80|bs13|plain|attention"


def test_one_seeding_scheme_by_case_id():
    assert case_seed("decode-x", 3) == zlib.crc32(b"decode-x") * 1000 + 3
    spec = CaseSpec("decode", ((40, 1), (17, 1)), num_heads=2, num_kv_heads=1, layout="permuted", tag="a")
    twin = CaseSpec("decode", ((40, 1), (17, 1)), num_heads=2, num_kv_heads=1, layout="permuted", tag="b")
    assert len(spec.id) == len(twin.id) and spec.id != twin.id
    # the property's permutation follows the id, not its length (the old scheme seeded by len(id))
    case = spec.build()
    a = permute_blocks(case, seed=case_seed(spec.id, PLACEMENT_STREAM)).block_tables
    b = permute_blocks(case, seed=case_seed(twin.id, PLACEMENT_STREAM)).block_tables
    assert_differs(a, b, "the permutations two ids of one length draw")
    assert_equal(spec.build().query, spec.build().query, f"the query of two builds of {spec.id}")
