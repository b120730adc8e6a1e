"""Kernels: the tlsim model of the Triton programming model, the tlsim kernels, and the
real Triton kernel (imported lazily: ``pagedattn.kernels.triton_paged_attention``)."""
