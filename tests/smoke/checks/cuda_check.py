"""The smoke suite's CUDA program: it runs inside the test pods (``python3 -c <this file>``).

Standard library only, through the CUDA driver API (``libcuda.so.1``, which the NVIDIA container
toolkit mounts into a container that was handed GPUs) and a kernel in PTX that the driver compiles
for the GPU at hand: no CUDA toolkit in the image, the same program on every GPU generation.

- ``--expect-devices N``: exactly N GPUs are visible; with N >= 1 a vector addition runs on the
  first one and its result is checked element by element (as the GPU Operator's validator does
  with CUDA's vectorAdd sample); with 0 no GPU may be usable at all.
- ``--peer-to-peer``: every GPU copies a buffer to every other GPU directly (NVLink/NVSwitch) and
  the copy is checked.
- ``--hold SECONDS``: afterwards, keep running (holding the GPUs) that long.

It prints one JSON object (its last line) and exits 0 when everything held, 1 otherwise; CUDA's
own error names (``CUDA_ERROR_SYSTEM_NOT_READY``: Fabric Manager down or mismatched) are kept.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
import time
from typing import Any

# c[i] = a[i] + b[i] over n floats, for sm_52 and later (the driver JITs it for newer GPUs).
VECTOR_ADD_PTX = b"""
.version 6.4
.target sm_52
.address_size 64

.visible .entry vector_add(
    .param .u64 a,
    .param .u64 b,
    .param .u64 c,
    .param .u32 n
)
{
    .reg .pred %p;
    .reg .b32 %r<6>;
    .reg .f32 %f<4>;
    .reg .b64 %rd<11>;

    ld.param.u64 %rd1, [a];
    ld.param.u64 %rd2, [b];
    ld.param.u64 %rd3, [c];
    ld.param.u32 %r1, [n];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.s32 %r5, %r2, %r3, %r4;
    setp.ge.u32 %p, %r5, %r1;
    @%p bra DONE;
    cvta.to.global.u64 %rd4, %rd1;
    cvta.to.global.u64 %rd5, %rd2;
    cvta.to.global.u64 %rd6, %rd3;
    mul.wide.u32 %rd7, %r5, 4;
    add.s64 %rd8, %rd4, %rd7;
    add.s64 %rd9, %rd5, %rd7;
    add.s64 %rd10, %rd6, %rd7;
    ld.global.f32 %f1, [%rd8];
    ld.global.f32 %f2, [%rd9];
    add.f32 %f3, %f1, %f2;
    st.global.f32 [%rd10], %f3;
DONE:
    ret;
}
"""
KERNEL = b"vector_add"
ELEMENTS = 1 << 16
THREADS = 256
CUDA_ERROR_NO_DEVICE = 100


class CudaError(Exception):
    """A driver API call failed: its name (CUDA_ERROR_...), code and what was being done."""

    def __init__(self, call: str, code: int, name: str, text: str) -> None:
        super().__init__(f"{call} failed: {name} ({code}): {text}")
        self.call = call
        self.code = code


class Driver:
    """The few driver API calls the checks need, on ``libcuda.so.1`` through ctypes."""

    def __init__(self) -> None:
        self.cuda = ctypes.CDLL("libcuda.so.1")

    def _call(self, name: str, *args: Any) -> None:
        code = int(getattr(self.cuda, name)(*args))
        if code:
            raise CudaError(name, code, *self._describe(code))

    def _describe(self, code: int) -> tuple[str, str]:
        name, text = ctypes.c_char_p(), ctypes.c_char_p()
        self.cuda.cuGetErrorName(code, ctypes.byref(name))
        self.cuda.cuGetErrorString(code, ctypes.byref(text))
        return (
            (name.value or b"CUDA_ERROR_UNKNOWN").decode(),
            (text.value or b"").decode(),
        )

    def init(self) -> None:
        self._call("cuInit", 0)

    def device_count(self) -> int:
        count = ctypes.c_int()
        self._call("cuDeviceGetCount", ctypes.byref(count))
        return count.value

    def uuid(self, ordinal: int) -> str:
        raw = (ctypes.c_ubyte * 16)()
        self._call("cuDeviceGetUuid", raw, self._device(ordinal))
        hexa = bytes(raw).hex()
        return f"GPU-{hexa[:8]}-{hexa[8:12]}-{hexa[12:16]}-{hexa[16:20]}-{hexa[20:]}"

    def _device(self, ordinal: int) -> ctypes.c_int:
        device = ctypes.c_int()
        self._call("cuDeviceGet", ctypes.byref(device), ordinal)
        return device

    def context(self, ordinal: int) -> ctypes.c_void_p:
        """The device's primary context, made current."""
        context = ctypes.c_void_p()
        self._call("cuDevicePrimaryCtxRetain", ctypes.byref(context), self._device(ordinal))
        self._call("cuCtxSetCurrent", context)
        return context

    def allocate(self, size: int) -> ctypes.c_uint64:
        pointer = ctypes.c_uint64()
        self._call("cuMemAlloc_v2", ctypes.byref(pointer), ctypes.c_size_t(size))
        return pointer

    def upload(self, device: ctypes.c_uint64, host: ctypes.Array[Any]) -> None:
        self._call("cuMemcpyHtoD_v2", device, host, ctypes.c_size_t(ctypes.sizeof(host)))

    def download(self, host: ctypes.Array[Any], device: ctypes.c_uint64) -> None:
        self._call("cuMemcpyDtoH_v2", host, device, ctypes.c_size_t(ctypes.sizeof(host)))

    def add_vectors(self, a: ctypes.c_uint64, b: ctypes.c_uint64, c: ctypes.c_uint64) -> None:
        module, function = ctypes.c_void_p(), ctypes.c_void_p()
        self._call("cuModuleLoadData", ctypes.byref(module), ctypes.c_char_p(VECTOR_ADD_PTX))
        self._call("cuModuleGetFunction", ctypes.byref(function), module, KERNEL)
        n = ctypes.c_uint32(ELEMENTS)
        arguments = (ctypes.c_void_p * 4)(
            *(ctypes.cast(ctypes.byref(value), ctypes.c_void_p) for value in (a, b, c, n))
        )
        blocks = (ELEMENTS + THREADS - 1) // THREADS
        self._call(
            "cuLaunchKernel", function, blocks, 1, 1, THREADS, 1, 1, 0, None, arguments, None
        )
        self._call("cuCtxSynchronize")

    def can_access_peer(self, ordinal: int, peer: int) -> bool:
        can = ctypes.c_int()
        self._call(
            "cuDeviceCanAccessPeer", ctypes.byref(can), self._device(ordinal), self._device(peer)
        )
        return bool(can.value)

    def enable_peer_access(self, peer_context: ctypes.c_void_p) -> None:
        self._call("cuCtxEnablePeerAccess", peer_context, 0)

    def copy_peer(
        self,
        destination: ctypes.c_uint64,
        destination_context: ctypes.c_void_p,
        source: ctypes.c_uint64,
        source_context: ctypes.c_void_p,
        size: int,
    ) -> None:
        self._call(
            "cuMemcpyPeer",
            destination,
            destination_context,
            source,
            source_context,
            ctypes.c_size_t(size),
        )
        self._call("cuCtxSynchronize")


def floats(values: list[float]) -> ctypes.Array[ctypes.c_float]:
    return (ctypes.c_float * len(values))(*values)


def vector_add_problem(driver: Driver) -> str | None:
    """Run c = a + b on GPU 0 and compare with the host's sums; why it went wrong, or None."""
    driver.context(0)
    a = floats([float(i) for i in range(ELEMENTS)])
    b = floats([float(2 * i) for i in range(ELEMENTS)])
    size = ctypes.sizeof(a)
    pointers = [driver.allocate(size) for _ in range(3)]
    driver.upload(pointers[0], a)
    driver.upload(pointers[1], b)
    driver.add_vectors(*pointers)
    c = floats([0.0] * ELEMENTS)
    driver.download(c, pointers[2])
    wrong = [i for i in range(ELEMENTS) if c[i] != a[i] + b[i]]
    if wrong:
        first = wrong[0]
        return (
            f"vector addition gave wrong results at {len(wrong)} of {ELEMENTS} elements "
            f"(element {first}: {c[first]}, expected {a[first] + b[first]})"
        )
    return None


def peer_to_peer_problems(driver: Driver, count: int) -> list[str]:
    """Copy a buffer from every GPU to every other directly, and check what arrived."""
    contexts = [driver.context(ordinal) for ordinal in range(count)]
    pattern = floats([float(i % 251) for i in range(ELEMENTS)])
    size = ctypes.sizeof(pattern)
    problems = []
    for source in range(count):
        for target in range(count):
            if source == target:
                continue
            if not driver.can_access_peer(source, target):
                problems.append(f"GPU {source} cannot access GPU {target} as a peer")
                continue
            driver.context(source)
            driver.enable_peer_access(contexts[target])
            sent = driver.allocate(size)
            driver.upload(sent, pattern)
            driver.context(target)
            received = driver.allocate(size)
            driver.copy_peer(received, contexts[target], sent, contexts[source], size)
            back = floats([0.0] * ELEMENTS)
            driver.download(back, received)
            if list(back) != list(pattern):
                problems.append(f"the copy from GPU {source} to GPU {target} arrived corrupted")
    return problems


def run(arguments: argparse.Namespace, driver_factory: Any = Driver) -> dict[str, Any]:
    """The checks' outcome: ``{"devices", "uuids", "problems", ...}``."""
    result: dict[str, Any] = {"devices": 0, "uuids": [], "problems": []}
    try:
        driver = driver_factory()
    except OSError as error:
        # Not handed a GPU, the toolkit mounts no driver library: nothing can use a GPU.
        result["driver"] = f"no CUDA driver library: {error}"
        if arguments.expect_devices:
            result["problems"].append(f"no CUDA driver in the container ({error})")
        return result
    try:
        driver.init()
        result["devices"] = driver.device_count()
        result["uuids"] = [driver.uuid(ordinal) for ordinal in range(result["devices"])]
    except CudaError as error:
        if error.code != CUDA_ERROR_NO_DEVICE or arguments.expect_devices:
            result["problems"].append(str(error))
        return result
    expected = arguments.expect_devices
    if expected is not None and result["devices"] != expected:
        result["problems"].append(f"{result['devices']} GPUs visible, expected {expected}")
    try:
        if result["devices"] and expected:
            problem = vector_add_problem(driver)
            result["vector_add"] = "wrong results" if problem else "ok"
            result["problems"] += [problem] if problem else []
        if arguments.peer_to_peer:
            if result["devices"] < 2:
                result["problems"].append("peer-to-peer needs at least 2 GPUs")
            else:
                problems = peer_to_peer_problems(driver, result["devices"])
                result["peer_to_peer"] = "ok" if not problems else "failed"
                result["problems"] += problems
    except CudaError as error:
        result["problems"].append(str(error))
    return result


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="CUDA checks of the cluster smoke suite")
    parser.add_argument("--expect-devices", type=int, default=None)
    parser.add_argument("--peer-to-peer", action="store_true")
    parser.add_argument("--hold", type=float, default=0.0)
    return parser.parse_args(argv)


def main(argv: list[str], driver_factory: Any = Driver) -> int:
    arguments = parse(argv)
    result = run(arguments, driver_factory)
    print(json.dumps(result, sort_keys=True), flush=True)
    if arguments.hold:
        time.sleep(arguments.hold)
    return 1 if result["problems"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
