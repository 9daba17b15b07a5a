"""numba per-block kernels. Every kernel takes arrays and scalars only and mutates state arrays in place."""
