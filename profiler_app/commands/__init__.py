"""One module per ``gpu-profiler`` subcommand (a package for ``trial``, one module per verb),
each with ``register(subparsers)``."""

# Each command's line in ``gpu-profiler --help``, here so that the top-level help lists the
# commands without importing one (cli.build_parser with summary).
SUMMARIES = {
    "run": "profile this node continuously and publish annotations, metrics and rows",
    "analyze": "classify the GPUs of one node from Prometheus or a saved query_range answer",
    "report": "summarise the table store: hours per job type, idle GPU-hours, idle pods, traces, "
    "trials",
    "trace": "explain one job from an Nsight Systems report: busy time, idle gaps, kernels, "
    "copies, a bottleneck verdict",
    "trial": "try a training job on other placements (GPUs, packed or spread, GPU model), "
    "measured, bounded and cleaned up",
    "completion": "print a shell completion script (bash or zsh)",
    "unprotect": "remove the karpenter.sh/do-not-disrupt annotations the profiler set, "
    "cluster-wide",
    "demo": "fill a SQLite store with synthetic days of a small cluster, to try every report",
}
