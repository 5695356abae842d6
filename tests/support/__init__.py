"""Helpers shared by tests: signal generators, local servers (Prometheus, PostgreSQL, a stand-in Kubernetes API)."""
