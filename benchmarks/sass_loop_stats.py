"""What the kernel's inner loops compile to on sm_90, without a GPU: instructions, barriers,
tensor-core and memory instructions per iteration of each key loop, and registers.

    python benchmarks/sass_loop_stats.py                      # this checkout's defaults
    python benchmarks/sass_loop_stats.py --switch OFF_I32=False --switch prefill_block_n=32
    python benchmarks/sass_loop_stats.py --root /path/to/other/checkout

It compiles the configuration the sm_90 compile test compiles (bf16, Hq=32, Hkv=8, D=128,
page 16; ``tests/test_triton_compile.py``'s ``_AOT`` script, taken from ``--root``, run there without
the interpreter) and reads the cubins with the ``nvdisasm`` and ``ptxas`` that ship with
triton. Set PYTHONPATH to pick the triton (the H200 runs 3.6). A loop is a backward branch
spanning more than 40 instructions; the prefill kernel has two (unmasked, then masked tiles).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import subprocess
import sys
import tempfile


def aot_script(root: str) -> str:
    """The ``_AOT`` compile script of ``root``'s ``tests/test_triton_compile.py`` (``tests/test_triton.py``
    in checkouts from before the tests were split)."""
    for name in ("test_triton_compile.py", "test_triton.py"):
        path = os.path.join(root, "tests", name)
        if not os.path.exists(path):
            continue
        tree = ast.parse(open(path).read())
        for node in tree.body:
            if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "_AOT":
                return ast.literal_eval(node.value)
    raise SystemExit(f"{root}: tests/test_triton_compile.py has no _AOT script")


def _bin(tool: str) -> str:
    """A tool that ships with the imported triton (nvdisasm, ptxas)."""
    import triton

    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", tool)


def disassemble(cubin: str) -> str:
    """``cubin``'s machine code as text (triton's ``nvdisasm``)."""
    return subprocess.run([_bin("nvdisasm"), "-c", cubin], capture_output=True, text=True).stdout


def registers(ptx: str) -> str:
    """``ptxas -v``'s register count (and spills, where any) for ``ptx`` on sm_90a, from
    whichever bundled ptxas reads its PTX version (the newer one reads newer PTX)."""
    for ptxas in ("ptxas", "ptxas-blackwell"):
        log = subprocess.run([_bin(ptxas), "-v", "-arch=sm_90a", ptx, "-o", os.devnull], capture_output=True, text=True)
        if re.search(r"Used \d+ registers", log.stderr):
            spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log.stderr)
            spilt = ", ".join(f"spills {a} / {b} B" for a, b in spills if (a, b) != ("0", "0"))
            used = " ".join(re.findall(r"Used \d+ registers", log.stderr))
            return f"{used} ({ptxas})" + (f", {spilt}" if spilt else "")
    return "registers: no bundled ptxas could read the PTX"


def loop_stats(sass: str) -> list[dict]:
    """Per key loop of ``sass`` (a backward branch over more than 40 instructions): its
    instructions, integer ones, and barriers, tensor-core, exp and memory instructions."""
    lines = sass.splitlines()
    labels = {m.group(1): i for i, line in enumerate(lines) if (m := re.match(r"^\.(L_x_\d+):", line.strip()))}
    loops = []
    for i, line in enumerate(lines):
        m = re.search(r"BRA\s+`?\(?\.?(L_x_\d+)", line)
        if not m or m.group(1) not in labels or labels[m.group(1)] >= i:
            continue
        body = [x for x in lines[labels[m.group(1)] : i + 1] if re.search(r"/\*[0-9a-f]{4}\*/", x)]
        if len(body) <= 40:
            continue
        ops = [re.search(r"\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", x) for x in body]
        names = [o.group(1) for o in ops if o]
        count = {k: names.count(k) for k in ("BAR", "HGMMA", "HMMA", "MUFU", "LDG", "LDGSTS", "LDS", "LDSM", "STS")}
        integer = sum(names.count(k) for k in ("IMAD", "LEA", "IADD3", "SHF", "VIADD", "ISETP", "SEL", "LOP3"))
        loops.append({"instructions": len(body), "integer": integer, **count})
    return loops


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument(
        "--switch",
        action="append",
        default=[],
        help="NAME=VALUE: a tuning field (prefill_block_n=32), a kernel flag (OFF_I32=False, KV_FP8=1, "
        "FLAT_GRID=True) or a decode launch shape (decode_shape=[False,1,False]), as the compile test takes them",
    )
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--kv-dtype", default=None, help="e.g. float8_e4m3fn")
    args = ap.parse_args()
    switches = {k: ast.literal_eval(v) for k, v in (s.split("=", 1) for s in args.switch)}
    out = tempfile.mkdtemp()
    script = aot_script(args.root).replace(
        "        results.append({",
        "        open(os.path.join(OUT, name + '.cubin'), 'wb').write(c.asm['cubin'])\n"
        "        open(os.path.join(OUT, name + '.ptx'), 'w').write(c.asm['ptx'])\n"
        "        results.append({",
        1,
    )
    script = f"import os\nOUT = {out!r}\n" + script
    config = [[args.dtype, 32, 8, 128, 16, args.kv_dtype, False] + ([switches] if switches else [])]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), args.root) if p)
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    proc = subprocess.run(
        [sys.executable, "-c", script, json.dumps(config)], capture_output=True, text=True, env=env, cwd=args.root
    )
    if proc.returncode:
        raise SystemExit(proc.stderr[-3000:])
    import triton

    print(f"triton {triton.__version__}, {config[0]}")
    for name in ("prefill", "decode"):
        sass = disassemble(os.path.join(out, name + ".cubin"))
        print(f"{name}: {registers(os.path.join(out, name + '.ptx'))}")
        for i, loop in enumerate(loop_stats(sass)):
            print(f"  loop {i}: " + ", ".join(f"{k} {v}" for k, v in loop.items()))


if __name__ == "__main__":
    main()
