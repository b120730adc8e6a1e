"""The check's bound and verdict as Triton kernels on a GPU: the same numbers as the
torch path of ``pagedattn.oracle.policy`` and ``pagedattn.oracle.verdict``, in one launch
a block of rows. Empty on purpose: triton is imported only where the GPU path runs."""
