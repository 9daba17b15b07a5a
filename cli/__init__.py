"""The ``sparsepipe`` command line (cli.main).

One BLAS thread in a command's own process, set before NumPy loads BLAS: the refit's L-BFGS-B (scipy) calls BLAS,
whose multithreaded kernels sum in an order that depends on the thread count, so the same refit gave different
models on machines with different core counts (35k rows x 16.6M features, stsgd's support: 194 evaluations with
2 BLAS threads, 175 with 1). Dask gives its worker processes the same setting; a value the user exported is kept.
"""
import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
