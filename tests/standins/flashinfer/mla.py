"""Stand-in for ``flashinfer.mla.BatchMLAPagedAttentionWrapper`` (0.5.3), our own code from
its docstrings and public signatures.

Absorbed-form MLA over two paged caches: ``ckv_cache [num_pages, page_size, head_dim_ckv]``
(the compressed latent, which is also the value) and ``kpe_cache [num_pages, page_size,
head_dim_kpe]`` (the rotary part). Query token ``t`` of head ``h`` scores key ``j`` as
``sm_scale * (q_nope[t, h] . ckv_j + q_pe[t, h] . kpe_j)``; the output ``[T, H, head_dim_ckv]``
is the softmax-weighted sum of ``ckv_j``. Pages by CSR ``kv_indptr``/``kv_indices`` and the
history length ``kv_len_arr`` (no last-page length); ``causal`` is bottom-right aligned (key
``j`` is hidden from row ``i`` when ``j + qo_len > kv_len + i``). The lse comes back in base 2
unless ``run(return_lse_base_on_e=True)``. fp16/bf16 only, the cache in the query's dtype;
the kernels read the caches through their page and token strides, the last dimension unit
stride. Float32 arithmetic on the tensors' own device.
"""

from __future__ import annotations

import math

import torch

_HALF = (torch.float16, torch.bfloat16)


class BatchMLAPagedAttentionWrapper:
    def __init__(
        self,
        float_workspace_buffer: torch.Tensor,
        use_cuda_graph: bool = False,
        qo_indptr=None,
        kv_indptr=None,
        kv_indices=None,
        kv_len_arr=None,
        backend: str = "auto",
    ) -> None:
        if backend not in ("auto", "fa2", "fa3", "cutlass"):
            raise ValueError(f"Invalid backend {backend}")
        self._backend = backend
        self.device = float_workspace_buffer.device
        self._plan: dict | None = None

    def plan(
        self,
        qo_indptr: torch.Tensor,
        kv_indptr: torch.Tensor,
        kv_indices: torch.Tensor,
        kv_len_arr: torch.Tensor,
        num_heads: int,
        head_dim_ckv: int,
        head_dim_kpe: int,
        page_size: int,
        causal: bool,
        sm_scale: float,
        q_data_type: torch.dtype,
        kv_data_type: torch.dtype,
        use_profiler: bool = False,
    ) -> None:
        for t, name in ((kv_len_arr, "kv_len_arr"), (kv_indptr, "kv_indptr"), (qo_indptr, "qo_indptr")):
            if t.dtype != torch.int32:
                raise ValueError(f"Expected {name}.dtype == torch.int32, got {t.dtype}")
        if kv_indices.dtype != torch.int32:
            raise ValueError(f"Expected kv_indices.dtype == torch.int32, got {kv_indices.dtype}")
        if q_data_type not in _HALF or kv_data_type != q_data_type:
            raise ValueError(f"Unsupported dtypes q {q_data_type} / kv {kv_data_type}: fp16/bf16, one dtype")
        self._plan = dict(
            qo_indptr=qo_indptr.tolist(),
            kv_indptr=kv_indptr.tolist(),
            kv_indices=kv_indices.clone(),
            kv_len=kv_len_arr.tolist(),
            num_heads=num_heads,
            head_dim_ckv=head_dim_ckv,
            head_dim_kpe=head_dim_kpe,
            page_size=page_size,
            causal=causal,
            sm_scale=sm_scale,
            dtype=q_data_type,
        )

    def run(
        self,
        q_nope: torch.Tensor,
        q_pe: torch.Tensor,
        ckv_cache: torch.Tensor,
        kpe_cache: torch.Tensor,
        out=None,
        lse=None,
        return_lse: bool = False,
        profiler_buffer=None,
        kv_len=None,
        page_table=None,
        return_lse_base_on_e: bool = False,
    ):
        plan = self._plan
        if plan is None:
            raise RuntimeError("plan() must be called before run()")
        expected = {
            "q_nope": (q_nope, (plan["num_heads"], plan["head_dim_ckv"])),
            "q_pe": (q_pe, (plan["num_heads"], plan["head_dim_kpe"])),
            "ckv_cache": (ckv_cache, (plan["page_size"], plan["head_dim_ckv"])),
            "kpe_cache": (kpe_cache, (plan["page_size"], plan["head_dim_kpe"])),
        }
        for name, (t, tail) in expected.items():
            if t.dim() != 3 or tuple(t.shape[1:]) != tail:
                raise ValueError(f"{name}: expected [*, {tail[0]}, {tail[1]}], got {tuple(t.shape)}")
            if t.dtype != plan["dtype"]:
                raise ValueError(f"{name}: dtype {t.dtype} differs from plan's {plan['dtype']}")
            if t.stride(-1) != 1:
                raise ValueError(f"{name}: the kernels read a unit-stride last dimension, got stride {t.stride()}")
        T, H, _ = q_nope.shape
        o = torch.empty(T, H, plan["head_dim_ckv"], dtype=torch.float32, device=q_nope.device)
        lse2 = torch.empty(T, H, dtype=torch.float32, device=q_nope.device)
        qo, kvp = plan["qo_indptr"], plan["kv_indptr"]
        for r in range(len(qo) - 1):
            pages = plan["kv_indices"][kvp[r] : kvp[r + 1]].long()
            L, n = plan["kv_len"][r], qo[r + 1] - qo[r]
            ckv = ckv_cache[pages].reshape(-1, plan["head_dim_ckv"])[:L].float()  # [L, Dc]
            kpe = kpe_cache[pages].reshape(-1, plan["head_dim_kpe"])[:L].float()  # [L, Dr]
            rows = slice(qo[r], qo[r + 1])
            s = (q_nope[rows].float() @ ckv.T + q_pe[rows].float() @ kpe.T) * plan["sm_scale"]  # [n, H, L]
            if plan["causal"]:
                i = torch.arange(n, device=s.device)[:, None, None]
                j = torch.arange(L, device=s.device)[None, None, :]
                s = s.masked_fill(j + n > L + i, -math.inf)
            row_lse = torch.logsumexp(s, dim=-1)  # [n, H]
            o[rows] = torch.softmax(s, dim=-1) @ ckv
            lse2[rows] = row_lse if return_lse_base_on_e else row_lse / math.log(2.0)
        result = o.to(q_nope.dtype)
        if out is not None:
            out.copy_(result)
            result = out
        return (result, lse2) if return_lse else result
