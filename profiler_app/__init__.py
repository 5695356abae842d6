"""gpu-profiler: continuous GPU usage profiling for Kubernetes nodes and workstations."""

__version__ = "0.1.0"
