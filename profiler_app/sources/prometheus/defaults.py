"""The Prometheus options' defaults, apart from the client: ``run --help`` and ``analyze --help``
show them without loading requests and numpy (the package's ``__init__`` loads its modules
lazily, so importing this one loads nothing else)."""

DEFAULT_STEP_SECONDS = 10.0  # dcgm-exporter collects every 30 s by default; 10 s loses nothing
DEFAULT_MAX_POINTS = 1_000  # the default step coarsens so a window has at most this many points
DEFAULT_MAX_BYTES = 16 * 2**20  # one answer's byte cap (bounded)
DEFAULT_DEADLINE_SECONDS = 15.0  # one request's deadline: half the daemon's default 30 s interval
