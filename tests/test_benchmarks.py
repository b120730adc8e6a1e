"""The benchmark harness runs end to end in its CPU mode (tiny sizes, Triton interpreter),
so it never rots. No timing is asserted. Every run of a harness (10-17 s of a core each) is
``slow``: CI runs them in its second step; the default run plots from a recorded result."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parent.parent / "benchmarks" / "bench_paged_attention.py"


@pytest.mark.slow
def test_cpu_mode_writes_every_figure(tmp_path):
    triton = pytest.importorskip("triton", reason="triton is an optional extra: pip install triton")
    if tuple(int(x) for x in triton.__version__.split(".")[:2]) < (3, 6):
        pytest.skip(f"triton {triton.__version__}'s interpreter cannot run the kernel (needs >= 3.6)")
    out = tmp_path / "cpu.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--cpu", "--out", str(out)], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert {"machine", "copy_TBps", "decode", "decode_variants", "prefill", "mixed", "targets"} <= set(result)
    assert "interpreter" in result["machine"]["note"]
    for p in result["decode"]:
        assert set(p["ms"]) >= {"triton_paged", "triton_prepare", "sdpa_contiguous", "gather_then_sdpa"}
        assert all(v > 0 for v in p["ms"].values())
        assert p["max_abs_err_vs_fp32_sdpa"] < 1e-2, "the timed kernel must compute attention"
    assert all({"target", "value", "floor", "met"} <= set(t) for t in result["targets"])
    assert "targets met" in proc.stdout


def test_plots_from_a_result(tmp_path):
    pytest.importorskip("matplotlib", reason="plots need matplotlib")
    src = Path(__file__).parent.parent / "benchmarks" / "results" / "h200.json"
    dst = tmp_path / "h200.json"
    dst.write_text(src.read_text())
    proc = subprocess.run([sys.executable, str(SCRIPT), "--plot", str(dst)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "h200-decode-time.png").stat().st_size > 1000
    assert (tmp_path / "h200-prefill.png").stat().st_size > 1000


@pytest.mark.slow
def test_variant_bench_cpu_mode(tmp_path):
    triton = pytest.importorskip("triton", reason="triton is an optional extra: pip install triton")
    if tuple(int(x) for x in triton.__version__.split(".")[:2]) < (3, 6):
        pytest.skip(f"triton {triton.__version__}'s interpreter cannot run the kernel (needs >= 3.6)")
    out = tmp_path / "variants.json"
    script = SCRIPT.parent / "bench_attention_variants.py"
    proc = subprocess.run(
        [sys.executable, str(script), "--cpu", "--out", str(out)], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    names = {r["variant"] for r in rows}
    assert {"none", "softcap50", "alibi", "sinks", "fp8_e4m3", "lse", "window128+sinks"} <= names
    assert all(r["decode_ms"] > 0 and r["prefill_ms"] > 0 for r in rows)


@pytest.mark.slow
def test_suite_bench_smoke(tmp_path):
    """bench_suite.py measures the oracle and the check on two tiny cases, each in its own
    process, and records the machine; the figures are positive (never compared)."""
    out = tmp_path / "suite.json"
    script = SCRIPT.parent / "bench_suite.py"
    proc = subprocess.run(
        [sys.executable, str(script), "--smoke", "--device", "cpu", "--repeats", "1", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert {"machine", "checks", "worst_check_over_oracle"} <= set(result)
    assert result["machine"]["device"] == "cpu" and result["machine"]["torch_threads"] >= 1
    assert len(result["checks"]) == 2
    for row in result["checks"]:
        assert row["oracle_s"] > 0 and row["check_s"] > 0 and row["oracle_peak_mb"] >= 0, row
        assert row["case"] in proc.stdout


@pytest.mark.slow
def test_sass_loop_stats_reads_the_compiled_loops():
    """benchmarks/sass_loop_stats.py (compiles the kernel for sm_90 through the compile test's
    script, reads the cubins) finds the two prefill loops and the decode loop, with their
    tensor-core instructions: the figures NOTES quotes come from it."""
    pytest.importorskip("triton", reason="triton is an optional extra: pip install triton")
    tool = Path(__file__).parent.parent / "benchmarks" / "sass_loop_stats.py"
    proc = subprocess.run([sys.executable, str(tool)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    kernels = proc.stdout.split("\nprefill:")[1].split("\ndecode:")
    prefill_loops = [line for line in kernels[0].splitlines() if line.strip().startswith("loop")]
    decode_loops = [line for line in kernels[1].splitlines() if line.strip().startswith("loop")]
    assert len(prefill_loops) == 2 and all("HGMMA 12" in line for line in prefill_loops), proc.stdout
    assert decode_loops and "HMMA 32" in decode_loops[0], proc.stdout


@pytest.mark.slow
def test_mla_tree_bench_cpu_mode(tmp_path):
    """bench_mla_tree.py on the interpreter: every MLA point timed (FlashInfer's columns null
    without it), every tree point with its causal twin."""
    triton = pytest.importorskip("triton", reason="triton is an optional extra: pip install triton")
    if tuple(int(x) for x in triton.__version__.split(".")[:2]) < (3, 6):
        pytest.skip(f"triton {triton.__version__}'s interpreter cannot run the kernel (needs >= 3.6)")
    out = tmp_path / "mla-tree.json"
    script = SCRIPT.parent / "bench_mla_tree.py"
    proc = subprocess.run(
        [sys.executable, str(script), "--cpu", "--out", str(out)], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["mla"] and result["tree"], f"no points: {result}"
    for row in result["mla"]:
        assert row["triton_ms"] > 0 and row["flashinfer_ms"] is None, f"an MLA point on the CPU: {row}"
        assert len(row["tunings_ms"]) >= 2 and row["triton_ms"] == row["tunings_ms"]["shipped"], row
    for row in result["tree"]:
        assert row["tree_ms"] > 0 and row["causal_ms"] > 0, f"a tree point: {row}"
    pytest.importorskip("matplotlib", reason="plots need matplotlib")
    for row in result["mla"]:  # FlashInfer's figures, for the plot
        row["triton_over_flashinfer"] = 1.0
    out.write_text(json.dumps(result))
    proc = subprocess.run([sys.executable, str(script), "--plot", str(out)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert all((tmp_path / f"mla-tree-{name}.png").stat().st_size > 1000 for name in ("mla", "tree"))
