"""numba per-block kernels. Every kernel takes arrays and scalars only and mutates state arrays in place."""
import sys


def numba_started() -> bool:
    """Whether this process has imported numba. Its start (~0.6 s: the import and the first call's target
    registries) is then paid or under way, so the kernel is used; before it, the pure NumPy/Python twins of the
    kernels a short command needs (block scores, checksums) give the same bits without starting it."""
    return "numba" in sys.modules
