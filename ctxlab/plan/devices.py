"""Accelerators the planner and the simulator can price time on.

Peak figures are the vendors' datasheet numbers for dense 16-bit tensor math (no sparsity)
and HBM bandwidth; real kernels reach a fraction of them, which is why the simulator takes
efficiency factors. Memory is in exact bytes (binary GiB where the product is sized so).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ctxlab.errors import CtxlabError

GIB = 1024**3


@dataclass(frozen=True)
class Device:
    name: str
    peak_flops: float  # dense 16-bit FLOP/s
    mem_bandwidth: float  # bytes/s
    memory_bytes: int
    source: str = ""

    def __post_init__(self) -> None:
        for field_name in ("peak_flops", "mem_bandwidth", "memory_bytes"):
            if getattr(self, field_name) <= 0:
                raise CtxlabError(
                    f"device {self.name!r}: {field_name} must be positive, "
                    f"got {getattr(self, field_name)}"
                )


DEVICES: dict[str, Device] = {
    "h100": Device(
        "h100",
        peak_flops=989e12,
        mem_bandwidth=3.35e12,
        memory_bytes=80 * GIB,
        source="NVIDIA H100 SXM datasheet: 989 TFLOPS dense BF16, 3.35 TB/s HBM3, 80 GB",
    ),
    "h200": Device(
        "h200",
        peak_flops=989e12,
        mem_bandwidth=4.8e12,
        memory_bytes=141 * 10**9,
        source="NVIDIA H200 SXM datasheet: 989 TFLOPS dense BF16, 4.8 TB/s HBM3e, 141 GB",
    ),
    "a100-80gb": Device(
        "a100-80gb",
        peak_flops=312e12,
        mem_bandwidth=2.039e12,
        memory_bytes=80 * GIB,
        source="NVIDIA A100 80GB SXM datasheet: 312 TFLOPS dense BF16, 2,039 GB/s HBM2e",
    ),
}


def get_device(name: str) -> Device:
    key = name.strip().lower()
    if key not in DEVICES:
        raise CtxlabError(f"unknown device {name!r}; known devices: {', '.join(sorted(DEVICES))}")
    return DEVICES[key]


def custom_device(peak_flops: float, mem_bandwidth: float, memory_bytes: int) -> Device:
    return Device(
        "custom", peak_flops, mem_bandwidth, memory_bytes, source="given on the command line"
    )


def device_from_options(
    name: str,
    peak_flops: float | None = None,
    mem_bandwidth: float | None = None,
    memory_bytes: int | None = None,
    flags: tuple[str, str, str] = ("--peak-flops", "--mem-bandwidth", "--memory-bytes"),
) -> Device:
    """A preset device with any of its numbers overridden, or `custom` with all three given
    (`flags` name the command's options, so the error names what the user must add)."""
    if name.strip().lower() == "custom":
        if peak_flops is None or mem_bandwidth is None or memory_bytes is None:
            raise CtxlabError(f"a custom device needs {', '.join(flags[:2])} and {flags[2]}")
        return custom_device(peak_flops, mem_bandwidth, memory_bytes)
    device = get_device(name)
    changes = {
        key: value
        for key, value in (
            ("peak_flops", peak_flops),
            ("mem_bandwidth", mem_bandwidth),
            ("memory_bytes", memory_bytes),
        )
        if value is not None
    }
    if not changes:
        return device
    return replace(
        device,
        name=f"{device.name} (custom)",
        source="overridden on the command line",
        **changes,
    )
