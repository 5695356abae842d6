"""Helpers shared by tests: signal generators and local servers."""
