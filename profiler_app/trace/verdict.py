"""What limits a GPU in a trace: documented thresholds over a GPU's figures, pure functions.

Every rule measures a share of the GPU's profiled span (first to last activity on it) and fires
past its threshold; the verdict is the fired rule with the largest share, so figures of
different rules compare in one unit: time. When none fires, the largest share still names the
verdict, and its evidence says that no threshold was reached. Idle time is split three ways:
gaps of ``LARGE_GAP_NS`` or more (the host left the GPU waiting: input), shorter gaps that
began while the host was blocked in a synchronising call (sync), and the other short gaps (the
host could not issue work fast enough: launch).

- ``input-bound``: large gaps hold ``INPUT_MIN_SHARE`` of the span, and there are at least
  ``INPUT_MIN_GAPS`` of them (a pattern, not one pause).
- ``launch-bound``: at least ``LAUNCH_MIN_SHORT_SHARE`` of the kernels run under
  ``SHORT_KERNEL_NS`` and the launch calls take ``LAUNCH_MIN_API_RATIO`` of the kernel time;
  or the other short gaps hold ``LAUNCH_MIN_IDLE_SHARE`` of the span.
- ``transfer-bound``: copies and memsets take ``TRANSFER_MIN_SHARE`` of the span, or copies
  from or to pageable host memory take ``PAGEABLE_MIN_SHARE``.
- ``sync-bound``: short gaps that began during synchronising calls hold ``SYNC_MIN_SHARE`` of
  the span, over at least ``SYNC_MIN_CALLS`` calls.
- ``compute-bound``: busy ``COMPUTE_MIN_BUSY`` of the span, with kernels averaging at least
  ``LONG_KERNEL_NS``; time when only NCCL kernels run does not count as busy, nor do NCCL
  kernels as compute.
- ``communication-bound``: NCCL kernels run with nothing else on the GPU (no other kernel, copy
  or memset: compute waits on communication) for ``COMMUNICATION_MIN_EXPOSED`` of the span, or
  take ``COMMUNICATION_MIN_SHARE`` of it even overlapped with compute. Its share is the exposed
  time: collectives hidden behind compute cost little.
"""

from __future__ import annotations

from dataclasses import dataclass

LARGE_GAP_NS = 1_000_000  # 1 ms: far beyond launch latency; the host was busy elsewhere
INPUT_MIN_SHARE = 0.20
INPUT_MIN_GAPS = 3
SHORT_KERNEL_NS = 20_000  # 20 us: a few launch latencies (a launch call costs ~2-10 us)
LAUNCH_MIN_SHORT_SHARE = 0.5
LAUNCH_MIN_API_RATIO = 0.5
LAUNCH_MIN_IDLE_SHARE = 0.20
TRANSFER_MIN_SHARE = 0.25
PAGEABLE_MIN_SHARE = 0.05
SYNC_MIN_SHARE = 0.10
SYNC_MIN_CALLS = 3
COMPUTE_MIN_BUSY = 0.80
LONG_KERNEL_NS = 20_000
COMMUNICATION_MIN_EXPOSED = 0.20  # as large an idle share as input- and launch-bound's
COMMUNICATION_MIN_SHARE = 0.40
SYNC_SLACK_NS = 20_000  # a sync call returns a few us after the GPU drains

INPUT, LAUNCH, TRANSFER, SYNC, COMPUTE, COMMUNICATION = (
    "input-bound",
    "launch-bound",
    "transfer-bound",
    "sync-bound",
    "compute-bound",
    "communication-bound",
)
VERDICTS = (INPUT, LAUNCH, TRANSFER, SYNC, COMPUTE, COMMUNICATION)
ADVICE = {
    INPUT: "Feed the GPU faster: more DataLoader workers with pin_memory and prefetching, "
    "or move preprocessing onto the GPU.",
    LAUNCH: "Launch fewer, larger kernels: capture the step in a CUDA graph (torch.compile "
    'with mode="reduce-overhead"), fuse element-wise operations, or raise the batch size.',
    TRANSFER: "Move less data between host and GPU: keep tensors on the GPU, copy from pinned "
    "memory with non_blocking=True, and overlap copies with compute on another stream.",
    SYNC: "Take host synchronisations (.item(), .cpu(), torch.cuda.synchronize(), "
    "cudaMemGetInfo) out of the loop, or defer them, so the CPU can queue work ahead.",
    COMPUTE: "The GPU is saturated: speed up the top kernels (mixed precision and Tensor "
    "Cores, better algorithms) and inspect them with Nsight Compute.",
    COMMUNICATION: "Overlap communication with compute (DDP's gradient buckets, FSDP's "
    "prefetching), tune the bucket size (bucket_cap_mb) so collectives start early and are not "
    "too small, and check the topology: NVLink, or InfiniBand with GPUDirect RDMA, not PCIe or "
    "TCP sockets (NCCL_DEBUG=INFO names the transport).",
}


@dataclass(frozen=True)
class GpuFigures:
    """What the rules read about one GPU; times in nanoseconds."""

    span_ns: int
    busy_ns: int
    kernel_count: int
    kernel_ns: int
    short_kernels: int
    launch_ns: int  # API time of the calls that launched this GPU's kernels
    memory_ns: int  # copies and memsets, summed
    memory_count: int
    pageable_ns: int  # copies from or to pageable host memory
    pageable_count: int
    large_gap_count: int
    large_gap_ns: int
    sync_gap_ns: int  # short gaps that began during a synchronising call
    sync_calls: int
    sync_ns: int  # host time in synchronising calls (processes using this GPU)
    idle_ns: int
    iteration_ns: int | None = None
    communication_ns: int = 0  # NCCL kernels, summed (included in kernel_ns)
    communication_count: int = 0
    exposed_communication_ns: int = 0  # when only NCCL kernels ran (included in busy_ns)
    top_collective: str | None = None  # the NCCL kernel with the most time


@dataclass(frozen=True)
class Finding:
    verdict: str
    share: float  # of the span this cause accounts for
    fired: bool
    evidence: str


@dataclass(frozen=True)
class Verdict:
    name: str
    evidence: list[str]
    advice: str
    findings: list[Finding]


def _seconds(ns: float) -> str:
    seconds = ns / 1e9
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds * 1e6:.1f} us"


def _share(part: float, whole: float) -> float:
    return part / whole if whole > 0 else 0.0


def _input(f: GpuFigures) -> Finding:
    share = _share(f.large_gap_ns, f.span_ns)
    per_iteration = ""
    if f.iteration_ns and f.large_gap_count:
        iterations = f.span_ns / f.iteration_ns
        per_iteration = f" ({f.large_gap_count / iterations:.1f} per iteration)"
    return Finding(
        INPUT,
        share,
        share >= INPUT_MIN_SHARE and f.large_gap_count >= INPUT_MIN_GAPS,
        f"{f.large_gap_count:,} idle gaps of {_seconds(LARGE_GAP_NS)} or more{per_iteration} "
        f"hold {share:.1%} of the span ({_seconds(f.large_gap_ns)}); "
        f"the GPU is busy {_share(f.busy_ns, f.span_ns):.1%}",
    )


def _launch(f: GpuFigures) -> Finding:
    other_gaps = max(f.idle_ns - f.large_gap_ns - f.sync_gap_ns, 0)
    share = _share(other_gaps, f.span_ns)
    short = _share(f.short_kernels, f.kernel_count)
    ratio = _share(f.launch_ns, f.kernel_ns)
    many_short = short >= LAUNCH_MIN_SHORT_SHARE and ratio >= LAUNCH_MIN_API_RATIO
    average = _seconds(f.kernel_ns / f.kernel_count) if f.kernel_count else "-"
    return Finding(
        LAUNCH,
        share,
        f.kernel_count > 0 and (many_short or share >= LAUNCH_MIN_IDLE_SHARE),
        f"{short:.0%} of {f.kernel_count:,} kernels run under {_seconds(SHORT_KERNEL_NS)} "
        f"(average {average}); launch calls take {_seconds(f.launch_ns)}, {ratio:.2f}x the "
        f"kernel time; short gaps between kernels hold {share:.1%} of the span",
    )


def _transfer(f: GpuFigures) -> Finding:
    share = _share(f.memory_ns, f.span_ns)
    pageable = _share(f.pageable_ns, f.span_ns)
    text = (
        f"{f.memory_count:,} copies and memsets take {share:.1%} of the span "
        f"({_seconds(f.memory_ns)})"
    )
    if f.pageable_count:
        text += (
            f"; {f.pageable_count:,} copies use pageable host memory "
            f"({_seconds(f.pageable_ns)}, {pageable:.1%})"
        )
    return Finding(
        TRANSFER,
        share,
        share >= TRANSFER_MIN_SHARE or pageable >= PAGEABLE_MIN_SHARE,
        text,
    )


def _sync(f: GpuFigures) -> Finding:
    share = _share(f.sync_gap_ns, f.span_ns)
    return Finding(
        SYNC,
        share,
        share >= SYNC_MIN_SHARE and f.sync_calls >= SYNC_MIN_CALLS,
        f"the host waited {_seconds(f.sync_ns)} in {f.sync_calls:,} synchronising calls; "
        f"idle gaps that began during them hold {share:.1%} of the span",
    )


def _compute(f: GpuFigures) -> Finding:
    busy_ns = f.busy_ns - f.exposed_communication_ns
    kernel_ns = f.kernel_ns - f.communication_ns
    kernel_count = f.kernel_count - f.communication_count
    busy = _share(busy_ns, f.span_ns)
    share = _share(min(kernel_ns, busy_ns), f.span_ns)
    average = kernel_ns / kernel_count if kernel_count else 0.0
    busy_text = f"the GPU is busy {busy:.1%} of {_seconds(f.span_ns)}"
    kernels = "kernels"
    if f.communication_count:
        exposed = _share(f.exposed_communication_ns, f.span_ns)
        busy_text = (
            f"the GPU is busy with compute {busy:.1%} of {_seconds(f.span_ns)} (with NCCL "
            f"kernels alone a further {exposed:.1%})"
        )
        kernels = "kernels other than NCCL's"
    return Finding(
        COMPUTE,
        share,
        busy >= COMPUTE_MIN_BUSY and average >= LONG_KERNEL_NS,
        f"{busy_text}; {kernels} average {_seconds(average)}",
    )


def _communication(f: GpuFigures) -> Finding:
    share = _share(f.exposed_communication_ns, f.span_ns)
    total = _share(f.communication_ns, f.span_ns)
    top = f", mostly {f.top_collective}" if f.top_collective else ""
    return Finding(
        COMMUNICATION,
        share,
        f.communication_count > 0
        and (share >= COMMUNICATION_MIN_EXPOSED or total >= COMMUNICATION_MIN_SHARE),
        f"{f.communication_count:,} NCCL kernels take {_seconds(f.communication_ns)}, "
        f"{total:.1%} of the span{top}; for {share:.1%} of the span "
        f"({_seconds(f.exposed_communication_ns)}) nothing else ran beside them: compute "
        "waited on communication",
    )


# Order breaks ties between equal shares: the more specific, cheaper fix first.
_RULES = (_transfer, _sync, _input, _launch, _compute, _communication)


def judge(figures: GpuFigures) -> Verdict:
    """The verdict for one GPU, its evidence (the deciding finding first) and advice."""
    findings = [rule(figures) for rule in _RULES]
    fired = [finding for finding in findings if finding.fired]
    candidates = fired or findings
    best = max(candidates, key=lambda finding: finding.share)  # first of equals wins
    evidence = [best.evidence]
    evidence += [f"also {f.verdict}: {f.evidence}" for f in fired if f is not best]
    if not fired:
        evidence.append(
            "no rule reached its threshold; this is the largest share of the span "
            "(see docs/trace.md)"
        )
    return Verdict(best.verdict, evidence, ADVICE[best.verdict], findings)
