"""What this machine can hold: its available memory and the CPUs this process may use.

Counts and sizes from configs and flags are checked against these before the work that
needs them (a KV pool of 10^12 tokens, 10^9 torch threads), so the answer is one sentence
naming the limit instead of a failed allocation deep inside torch. Nothing here imports
torch.
"""

from __future__ import annotations

import os

from ctxlab.errors import CtxlabError

OVERSUBSCRIBE = 4  # threads per CPU still accepted


def available_memory() -> int | None:
    """Bytes of memory available now (Linux MemAvailable; else free pages), None if unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def check_threads(value: int, name: str = "--threads", allow_zero: bool = False) -> int:
    """A thread count from 1 (or 0 for "the default") up to 4 per CPU this process may use:
    a few more threads than CPUs only slow torch down (a config written for a larger machine
    still runs), more than that is a typo, and 10^9 of them cannot be created."""
    low = 0 if allow_zero else 1
    cpus = usable_cpus()
    high = OVERSUBSCRIBE * cpus
    if value < low:
        raise CtxlabError(f"{name} must be at least {low}, got {value}.")
    if value > high:
        raise CtxlabError(
            f"{name} {value:,} is more than {OVERSUBSCRIBE} per CPU this process may use "
            f"({cpus} CPUs); give {low} to {high}."
        )
    return value


def check_fits_in_memory(need: int, what: str, available: int | None = None) -> None:
    """Refuse `need` bytes of `what` when they exceed the memory available now."""
    free = available_memory() if available is None else available
    if free is not None and need > free:
        raise CtxlabError(
            f"{what} needs {need / 2**30:,.1f} GiB, more than the {free / 2**30:,.1f} GiB this "
            "machine has available; make it smaller."
        )
