"""The node harness: root filesystem cache, booted nodes, apt proxy, stand-in vendor repositories.

Everything here drives real tools (debootstrap, systemd-nspawn, apt-cacher-ng, dpkg-deb, gpg,
ansible-playbook); the only test doubles are the stand-in vendor packages (see standin_repo).
"""
