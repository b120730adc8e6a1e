"""Arrows run one way: the problem's rules and the index helpers import nothing of ours;
kernels and adapters never import the simulator or each other (``adapters.tlsim`` runs
the tlsim programs, and the Triton kernel's modules import its own host side and tiles)."""

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).parent.parent / "pagedattn"
SIMULATOR = ("pagedattn.kernels.tlsim", "pagedattn.kernels.tlsim_programs")
#: adapters proper (a backend each); the other modules of adapters/ are shared helpers
ADAPTERS = (
    "reference",
    "sdpa",
    "flex",
    "tlsim",
    "triton",
    "contrib.vllm",
    "contrib.sglang",
    "contrib.flashinfer",
    "contrib.flashinfer_mla",
    "contrib.flash_attn",
)


def _imports(path: Path) -> set[str]:
    """Every ``pagedattn`` module ``path`` imports, at any depth (lazy imports included)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("pagedattn"):
            out.add(node.module)
            # ``from pagedattn.kernels import tlsim`` imports a module
            out.update(f"{node.module}.{a.name}" for a in node.names if _is_module(f"{node.module}.{a.name}"))
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("pagedattn"))
    return out


def _is_module(name: str) -> bool:
    path = PKG.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _module(path: Path) -> str:
    return ".".join(path.relative_to(PKG.parent).with_suffix("").parts)


@pytest.mark.parametrize("name", ["validation", "indexing"])
def test_the_floor_imports_nothing_of_ours(name):
    assert not _imports(PKG / f"{name}.py"), f"pagedattn.{name} must import torch only"


def test_kernels_import_neither_the_simulator_nor_each_other():
    for path in (PKG / "kernels").glob("*.py"):
        mod = _module(path)
        got = {m for m in _imports(path) if m.startswith("pagedattn.kernels.")}
        k = "pagedattn.kernels."
        allowed = {
            k + "tlsim_programs": {k + "tlsim"},  # programs written in the model
            # the Triton kernel: its host side (checks, launch plan, tuning; no triton), its
            # shared tiles, its kernels (MLA's reuses the decode kernel's merge), and the host API
            # that launches them
            k + "decode_splits": {k + "tuning"},
            k + "launch_plan": {k + "checks", k + "decode_splits", k + "tuning"},
            k + "host": {k + "checks", k + "decode_splits", k + "launch_plan", k + "tuning"},
            k + "triton_prefill": {k + "triton_tiles"},
            k + "triton_decode": {k + "triton_tiles"},
            k + "triton_mla_decode": {k + "triton_decode", k + "triton_tiles"},
            k + "triton_paged_attention": {
                k + "checks",
                k + "launch_plan",
                k + "triton_decode",
                k + "triton_mla_decode",
                k + "triton_prefill",
                k + "tuning",
            },
        }.get(mod, set())
        assert got <= allowed, f"{mod} imports {sorted(got - allowed)}"


def test_adapters_import_neither_the_simulator_nor_each_other():
    adapters = {f"pagedattn.adapters.{a}" for a in ADAPTERS}
    for path in (PKG / "adapters").rglob("*.py"):
        mod = _module(path)
        got = _imports(path)
        simulator = {m for m in got if m in SIMULATOR} - ({*SIMULATOR} if mod == "pagedattn.adapters.tlsim" else set())
        assert not simulator, f"{mod} imports the simulator: {sorted(simulator)}"
        others = (got & adapters) - {mod}
        assert not others, f"{mod} imports other adapters: {sorted(others)}"
