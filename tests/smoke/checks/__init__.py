"""Smoke checks of a real GPU cluster after `pulumi up`: run with --kubeconfig (README.md)."""
