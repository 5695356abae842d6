"""Node checks valid on any host the playbooks provisioned: test nodes or real GPU servers."""
