"""``gpu-profiler trial``: short runs of a training job on other placements, measured, bounded
and cleaned up.

Pure parts (no I/O): ``placement`` (placements, nodes, fit), ``manifests`` (templates and each
trial's manifest with its safety settings), ``plan`` (the pruned grid and its cost),
``estimators`` (throughput from logs, metrics, waveforms), ``model`` (the fitted step-time model),
``prediction`` (trials the model makes unnecessary) and ``results`` (rows, Pareto front,
recommendation). I/O: ``cluster`` (the Kubernetes calls), ``metrics`` (Prometheus), ``runner``
(the run itself, with ``run_options`` and ``run_state``), which ``preparation`` sets up,
``scheduling`` starts trials for, ``watching`` and ``measuring`` follow them, and ``cleanup``
ends; ``progress`` draws the live table.
"""
