"""splitmix64 (Steele, Lea & Flood, OOPSLA 2014): the kernels' deterministic draws. A generator's whole state is
one uint64 (kept in the algorithm's state arrays, so a resumed run draws what an uninterrupted one would), or a
draw is a hash of the integers that name it (the same on every executor and worker count)."""
import numba
import numpy as np

GOLDEN = np.uint64(0x9E3779B97F4A7C15)
MIX1 = np.uint64(0xBF58476D1CE4E5B9)
MIX2 = np.uint64(0x94D049BB133111EB)


@numba.njit(cache=True, nogil=True, inline="always")
def mix64(z):
    """splitmix64's finaliser: 64 well-mixed bits of the uint64 ``z``."""
    z = (z ^ (z >> np.uint64(30))) * MIX1
    z = (z ^ (z >> np.uint64(27))) * MIX2
    return z ^ (z >> np.uint64(31))


@numba.njit(cache=True, nogil=True, inline="always")
def splitmix64(state):
    """One generator step on a uint64 state; returns (new_state, 64 random bits)."""
    state = state + GOLDEN
    return state, mix64(state)


@numba.njit(cache=True, nogil=True, inline="always")
def unit(z):
    """A uniform double in [0, 1) from 64 random bits (their top 53; z >> 11 < 2^53, so the signed conversion is
    exact and cheaper than the unsigned one)."""
    return float(np.int64(z >> np.uint64(11))) * (1.0 / 9007199254740992.0)
