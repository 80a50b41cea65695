"""Compiled kernels of the engine (numba), each with its pure-torch reference as fallback."""
