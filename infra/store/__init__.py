"""The profiler's table store in a cluster: where history lives (``profilerStore``).

- ``options.py``: the stack config (``profilerStore`` and the keys each store reads);
- ``endpoint.py``: a PostgreSQL store as its clients see it, and what the DaemonSet is given;
- ``credentials.py``: generated passwords and the CloudNativePG CA;
- ``cloudnative_pg.py``: the operator, the database cluster and its PgBouncer pooler;
- ``rds.py``: Amazon RDS for PostgreSQL and the Job that creates its users (``rds_roles.py``,
  ``rds_ca.py``);
- ``daemon.py``: the DaemonSet's environment and volumes for each store;
- ``grafana.py``: the store as a Grafana data source (read-only user).

Modules are imported by their own names; this package imports none of them.
"""
