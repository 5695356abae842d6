"""What ``gpu-profiler report`` answers over the store: the history views, right-sizing and
its engine."""
