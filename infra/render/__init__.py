"""Render what a stack installs, without a cluster, and check the whole object graph.

- ``program``: run a stack program under Pulumi's mock engine and record what it declares;
- ``charts``: the chart cache, and Helm charts rendered offline with the real Helm engine;
- ``graph``: every object the stack creates (its own and its releases'), and the platform below;
- ``checks``: what must hold for `pulumi up` to converge and the cluster to work, one module
  per check;
- ``__main__``: ``python -m infra.render``, the same for users (see stacks/README.md).
"""

# The checks of `--check`, in the order they run (infra.render.checks.CHECKS; a test keeps the two
# equal). Named here so that --help lists them without loading the checks.
CHECK_NAMES = (
    "values",
    "schema",
    "namespaces",
    "monitoring",
    "references",
    "grafana",
    "scheduling",
    "conflicts",
    "scalers",
    "admission",
)
