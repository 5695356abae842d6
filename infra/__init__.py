"""Pulumi components for GPU Kubernetes clusters and their monitoring and profiling layer."""
