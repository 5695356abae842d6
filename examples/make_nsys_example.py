"""Write examples/nsys-input-bound.sqlite: a small, synthetic Nsight Systems export to try
`gpu-profiler trace` on without a GPU.

Made with the project's model of the export (tests/support/nsys/: Nsight Systems 2024.6.2,
export schema 3.16.1, the tables `nsys export --type sqlite` writes). Two H100s run 30 steps of
25 ms: 10 ms of GEMM kernels, a 4 MiB host-to-device copy, then waiting for the next batch, so
`trace` calls them input-bound. One pageable copy and one stream synchronisation are added for
the memory and CUDA API tables.

Run from the repository root: python examples/make_nsys_example.py
"""

from pathlib import Path

import numpy as np

from tests.support.nsys.builder import ReportBuilder
from tests.support.nsys.schema import HTOD, PAGEABLE

MS, US = 1_000_000, 1_000
OUTPUT = Path(__file__).with_name("nsys-input-bound.sqlite")


def main() -> None:
    report = ReportBuilder(
        gpus={device: f"NVIDIA H100 80GB HBM3 #{device}" for device in range(2)},
        # No capture start: `trace` then stores it under the file's time (the checkout's), so
        # `report --by trace` lists it within its default 24 hours.
        session_start_utc_ns=None,
    )
    for device in range(2):
        for step in range(30):
            base = step * 25 * MS
            report.add_kernels("sm90_xmma_gemm", base + np.arange(10) * MS, 990 * US, device=device)
            report.add_copies(HTOD, [base + 10 * MS], 200 * US, 4 << 20, device=device)
    report.add_copies(HTOD, [900 * MS], MS, 1 << 20, host_kind=PAGEABLE)
    report.add_api_calls("cudaStreamSynchronize_v3020", [100 * MS], [101 * MS])
    OUTPUT.unlink(missing_ok=True)
    report.write(OUTPUT)


if __name__ == "__main__":
    main()
