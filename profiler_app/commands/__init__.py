"""One module per ``gpu-profiler`` subcommand, each with ``register(subparsers)``."""
