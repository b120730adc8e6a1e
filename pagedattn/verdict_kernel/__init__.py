"""The check's bound and verdict as Triton kernels on a GPU, in one launch a block of rows.

The same numbers as the torch path of ``pagedattn.oracle.policy`` and ``pagedattn.oracle.verdict``:
``host`` runs the check, ``launcher`` launches the kernels of ``kernel`` and ``reductions``. Empty
on purpose: triton is imported only where the GPU path runs."""
