"""Every planted bug fails the quick profile; the correct baseline passes.

The kill matrix (which family caught which bug) is recorded in docs/kill-matrix.md;
``python -m tests.kill_matrix`` regenerates it.

By default eight representative bugs run against one family of the quick profile that
the kill matrix records as catching them (the cheapest such family): a bug that fails part
of the quick profile fails the quick profile, so the assertion is the same, at a fraction
of the cost. Every bug runs against the whole quick profile under ``-m slow`` (CI's second
step, and the kill matrix).
"""

import json
from pathlib import Path

import pytest

from tests.helpers import run_inprocess
from tests.planted.streamed import BUGS

STREAMED = Path(__file__).parent / "planted" / "streamed.py"

#: One quick-profile family (a conformance module, optionally with a ``-k`` filter for
#: one property) per bug, chosen from docs/kill-matrix.md among those that catch it.
KILLER = {
    "no_rescale": ("test_decode", None),
    "tail_unmasked": ("test_decode", None),
    "wrong_gqa": ("test_gqa", None),
    "causal_off_by_one": ("test_prefill", None),
    "causal_ignores_past": ("test_continuation", None),
    "scale_ignored": ("test_decode", None),
    "contiguous_blocks": ("test_layout", None),
    "block_size_16": ("test_layout", None),
    "one_key_past": ("test_prefill", None),
    "last_block_misaddressed": ("test_decode", None),
    "first_seq_len": ("test_mixed", None),
    "exp_bf16": ("test_decode", None),
    "acc_fp16": ("test_decode", None),
    "query_bf16": ("test_decode", None),
    "drop_key": ("test_decode", None),
    "scale_1pct": ("test_decode", None),
    "nondeterministic": ("test_properties", "determinism"),
    "batch_dependent_order": ("test_properties", "batch_invariance"),
    "writes_cache": ("test_properties", "immutability"),
    "partly_unwritten": ("test_decode", None),
    "window_off_by_one": ("test_sliding_window", None),
    "softcap_after_mask": ("test_logits_soft_cap", None),
    "alibi_sign": ("test_alibi_slopes", None),
    "sink_dropped_in_split": ("test_sinks", None),
    "fp8_scale_ignored": ("test_fp8", None),
    "per_head_scale_per_tensor": ("test_fp8", None),
    "lse_log2": ("test_lse", None),
    "acc_input": ("test_continuation", None),
    "lsum_input": ("test_continuation", None),
    "p_fp8": ("test_fp8", None),
    "qk_reduced_input": ("test_decode", None),
    "mla_value_columns": ("test_mla", None),
    "mla_rope_dropped": ("test_mla", None),
    "tree_as_causal": ("test_tree_mask", None),
}


def run_quick(
    pytester, factory: str, module: str | None = None, keyword: str | None = None, in_process: bool = False
) -> dict:
    # a subprocess by default: in-process, the checkout's pagedattn/ (on sys.path for the tests)
    # would shadow an installed package and its pagedattn.conformance. The default run's runs
    # (each bug's family, the correct baseline's whole profile) take the tests' own pagedattn
    # in-process (a planted bug computes wrong numbers, it does not crash), which saves each the
    # ~3 s of a new interpreter importing torch
    target = "pagedattn.conformance" + (f".{module}" if module else "")
    args = ["-p", "no:cacheprovider", "-q", "--pyargs", target, f"--backend={STREAMED}:{factory}"]
    args.append("--report-json=r.json")
    if keyword:
        args += ["-k", keyword]
    result = run_inprocess(pytester, *args) if in_process else pytester.runpytest_subprocess(*args)
    report = json.loads((pytester.path / "r.json").read_text())
    report["ret"] = result.ret
    return report


def killers(report: dict) -> set[str]:
    """Families (properties by name) with at least one failed case."""
    out = set()
    for c in report["cases"]:
        if c["status"] == "failed":
            out.add(f"properties:{c['property']}" if c.get("property") else c["family"])
    return out


def test_every_bug_has_a_killer_family():
    assert set(KILLER) == set(BUGS), f"KILLER and BUGS differ: {sorted(set(KILLER) ^ set(BUGS))}"


def test_correct_baseline_passes(pytester):
    report = run_quick(pytester, "correct", in_process=True)
    assert report["ret"] == 0 and not killers(report), killers(report)


#: The default run's representatives, one per kind of mistake (precision, masking, layout,
#: a property, immutability, a variant, a split history, the lse); every bug runs against
#: the whole quick profile under -m slow, CI's second step.
REPRESENTATIVE = (
    "exp_bf16",
    "tail_unmasked",
    "contiguous_blocks",
    "nondeterministic",
    "writes_cache",
    "window_off_by_one",
    "sink_dropped_in_split",
    "lse_log2",
    "acc_input",
    "mla_rope_dropped",
    "tree_as_causal",
)


@pytest.mark.parametrize("bug", REPRESENTATIVE)
def test_planted_bug_fails_the_quick_profile(pytester, bug):
    module, keyword = KILLER[bug]
    report = run_quick(pytester, f"bug_{bug}", module, keyword, in_process=True)
    caught = killers(report)
    assert report["ret"] != 0 and caught, (
        f"planted bug {bug!r} ({BUGS[bug]}) passed {module}{f' -k {keyword}' if keyword else ''} of the quick profile"
    )


@pytest.mark.slow
@pytest.mark.parametrize("bug", sorted(BUGS))
def test_planted_bug_fails_the_whole_quick_profile(pytester, bug):
    report = run_quick(pytester, f"bug_{bug}")
    assert report["ret"] != 0 and killers(report), f"planted bug {bug!r} ({BUGS[bug]}) passed the quick profile"
