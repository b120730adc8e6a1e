"""The ``flashinfer_mla`` backend: FlashInfer's ``BatchMLAPagedAttentionWrapper``, absorbed-form MLA.

DeepSeek V2/V3 decode attends over one latent head per token: 512 compressed columns
(``ckv``, which are also the value) and 64 rotary ones (``kpe``). ``PagedCase`` holds it as
the key cache ``[N, bs, 1, 576]`` with the value cache a view of its first 512 columns
(variant ``"mla"``); FlashInfer takes the two parts as separate paged caches,
``ckv_cache [N, bs, 512]`` and ``kpe_cache [N, bs, 64]``, and the query as ``q_nope`` /
``q_pe`` likewise. The adapter passes views (``layouts.to_flashinfer_mla``: the kernels read
the page and token strides, so ``key_cache[:, :, 0, :512]`` needs no copy) and never writes
the case's tensors.

Conventions, converted at this boundary (0.5.3, ``flashinfer/mla.py``,
``include/flashinfer/attention/mla_hopper.cuh``):

- pages by CSR ``kv_indptr``/``kv_indices`` and the history length ``kv_len_arr`` (not a
  last-page length as in the other wrappers; the docstring calls it the query length);
- ``sm_scale`` is ``case.scale`` (the model's, from the head dim before absorption, not
  ``576 ** -0.5``);
- ``causal=True`` is bottom-right aligned (``kv_idx + qo_len > kv_len + q_idx`` is masked),
  like ours, so multi-token queries (MTP drafts, chunked prefill over the latent cache) run
  through the same call; a decode row sees its whole history either way;
- the lse comes back in base 2 (``run(return_lse_base_on_e=True)`` would scale it in the
  kernel; the adapter converts with ``lse_from_log2``, as for the other wrappers).

Claims: fp16 and bf16 with the cache in the query's dtype (``plan`` compiles one module per
``(q dtype, kv dtype, 512, 64)``; 0.5.3's ``run`` has no fp8 scales), head dim 576 with
head_dim_v 512 (the pair FlashInfer's tests and engines build), any page size (the kernels
find each token's page with a division by ``page_size``), any head count. No window,
soft-cap, ALiBi, sinks or tree mask: the MLA kernels have none of them (a custom mask is
``cudaErrorNotSupported`` in ``BatchMLAPageAttentionHopper``). A split history's partial
outputs are stored in the output dtype before the merge (``partial_o`` is ``DTypeO`` in
``mla.cuh`` and ``mla_hopper.cuh``): declared, ``partials_precision="input"``.
"""

from __future__ import annotations

import torch

from pagedattn.adapters.conventions import lse_from_log2
from pagedattn.adapters.layouts import to_flashinfer_mla
from pagedattn.adapters.protocol import INVARIANCES, Capabilities
from pagedattn.oracle import PagedCase

#: float workspace per device (FlashInfer's recommended 128 MB); zeroed before its first use
WORKSPACE_BYTES = 128 * 1024 * 1024
#: the latent split FlashInfer's MLA kernels are built and tested for (DeepSeek V2/V3)
HEAD_DIM_CKV, HEAD_DIM_KPE = 512, 64


def _latent_split(case: PagedCase, operation: str) -> str | None:
    """The one latent head of width 576 = 512 + 64 that the wrapper's module is compiled for,
    the value read from its first 512 columns."""
    if not case.shared_kv:
        return "the MLA wrapper reads the value as the key cache's first 512 columns; the case has its own"
    if case.num_kv_heads != 1:
        return f"MLA has one latent head; the case has {case.num_kv_heads} kv heads"
    if case.head_dim_v != HEAD_DIM_CKV:
        return f"head_dim_v {case.head_dim_v}: the MLA kernels are built for ckv {HEAD_DIM_CKV} + kpe {HEAD_DIM_KPE}"
    return None


def capabilities() -> Capabilities:
    """What the adapter claims for FlashInfer 0.5.x's MLA wrapper (reasons in the module docstring)."""
    return Capabilities(
        dtypes=frozenset({torch.float16, torch.bfloat16}),
        head_dims=frozenset({HEAD_DIM_CKV + HEAD_DIM_KPE}),
        devices=frozenset({"cuda"}),
        operations=frozenset({"attention", "lse"}),
        variants=frozenset({"mla"}),
        invariances=INVARIANCES - {"batch_invariance"},
        partials_precision="input",
        case_filter=_latent_split,
        notes={
            "dtypes": "fp16/bf16 queries with the cache in the same dtype; 0.5.3's run() takes no fp8 scales",
            "head_dims": "576 = ckv 512 + kpe 64, the split FlashInfer's MLA kernels are built and tested for",
            "devices": "CUDA kernels",
            "variants": "MLA only: the MLA kernels have no window, soft-cap, ALiBi, sinks or custom (tree) mask",
            "batch_invariance": "plan() balances the whole batch's KV over the SMs (MLAPlan), so a sequence's "
            "split, and the merge of its partial outputs, depend on its neighbours",
            "partials_precision": "a split history's partial outputs are stored in the output dtype "
            "(partial_o is DTypeO in mla.cuh and mla_hopper.cuh)",
        },
    )


class FlashInferMLABackend:
    """FlashInfer's ``BatchMLAPagedAttentionWrapper`` behind ``paged_attention``.

    Args:
        backend: the wrapper's ``backend``: ``"auto"`` (fa3 on Hopper, fa2 elsewhere), ``"fa2"``
            or ``"fa3"``.
    """

    name = "flashinfer_mla"

    def __init__(self, backend: str = "auto") -> None:
        try:
            import flashinfer
            import flashinfer.mla
        except ImportError as exc:
            raise ImportError("flashinfer is not installed: pip install flashinfer-python") from exc
        self._fi = flashinfer
        self.backend = backend
        self.version = f"flashinfer {getattr(flashinfer, '__version__', 'unknown')}"
        self.capabilities = capabilities()
        self._workspace: dict[torch.device, torch.Tensor] = {}

    @property
    def target(self) -> str:
        where = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device"
        return f"{self.version} (cuda: {where}; BatchMLAPagedAttentionWrapper, backend={self.backend})"

    def warmup(self, case: PagedCase) -> None:
        """Runs the case once: ``plan`` JIT-compiles (or loads) the module for its dtype outside the case's timeout."""
        self._run(case, return_lse=True)
        if case.device.type == "cuda":
            torch.cuda.synchronize(case.device)

    def paged_attention(self, case: PagedCase) -> torch.Tensor:
        return self._run(case, return_lse=False)

    def paged_attention_lse(self, case: PagedCase) -> tuple[torch.Tensor, torch.Tensor]:
        return self._run(case, return_lse=True)

    def _workspace_for(self, device: torch.device) -> torch.Tensor:
        if device not in self._workspace:
            self._workspace[device] = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        return self._workspace[device]

    def _run(self, case: PagedCase, return_lse: bool):
        a = to_flashinfer_mla(case)
        wrapper = self._fi.mla.BatchMLAPagedAttentionWrapper(
            self._workspace_for(case.query.device), backend=self.backend
        )
        wrapper.plan(
            a["qo_indptr"],
            a["kv_indptr"],
            a["kv_indices"],
            a["kv_len_arr"],
            a["num_heads"],
            a["head_dim_ckv"],
            a["head_dim_kpe"],
            a["page_size"],
            a["causal"],
            a["sm_scale"],
            case.dtype,
            case.kv_dtype,
        )
        result = wrapper.run(a["q_nope"], a["q_pe"], a["ckv_cache"], a["kpe_cache"], return_lse=return_lse)
        if not return_lse:
            return result
        out, lse2 = result  # out [T, Hq, 512] in the query dtype, lse2 [T, Hq] float32, base 2
        return out, lse_from_log2(lse2.float()).contiguous()
