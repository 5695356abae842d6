"""Booted Debian test nodes (systemd-nspawn) that verify the Ansible playbooks."""
