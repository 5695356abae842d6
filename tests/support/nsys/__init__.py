"""Nsight Systems SQLite exports built in the tests (test doubles: no GPU or nsys exists here).

A ``ReportBuilder`` writes a file with the tables, columns and enum values of a real
``nsys export --type sqlite`` report (Nsight Systems 2024.6.2, export schema 3.16.1). By job:

- ``schema``: the tables, columns and enum values, as NVIDIA documents and ships them;
- ``builder``: ``ReportBuilder`` and the rows its ``add_*`` methods add, shaped as real
  exports store them;
- ``files``: writing the export file, and ``tamper``, which alters a written one the way a
  damaged or hand-made export could be.
"""
