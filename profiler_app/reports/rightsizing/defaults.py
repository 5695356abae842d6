"""What ``report --help`` shows of right-sizing, apart from ``advice`` and ``output``: the
package's ``__init__`` loads its modules lazily, so importing this one loads nothing else."""

DEFAULT_HEADROOM = 0.15  # memory headroom over the peak framebuffer
# The metric: one sample (value 1) per workload with advice, its label ``profile`` the advice's
# one word: a MIG profile ("2g.20gb"), "time-slicing", "mps" or "full-gpu" (``output``).
RIGHTSIZE_METRIC = "gpu_profiler_rightsize_recommendation"
