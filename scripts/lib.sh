# shellcheck shell=bash
# Shared setup steps for scripts/run and scripts/test (sourced, not executed).
# Each step says what it does on stderr, one line, before it starts (a fresh machine takes
# minutes); the tools' own output is shown only when a step fails. stdout stays the program's.

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

say() {
    echo "$@" >&2
}

# Runs a command with its output held back, and shown on stderr only when it fails.
quietly() {
    local log status=0
    log="$(mktemp)"
    "$@" >"$log" 2>&1 || status=$?
    if [ "$status" -ne 0 ]; then
        cat "$log" >&2
        echo "==> failed (exit $status): $*" >&2
    fi
    rm -f "$log"
    return "$status"
}

# Installs the Debian/Ubuntu packages named, skipping the apt round trip when all are present.
install_system_packages() {
    local missing=()
    for package in "$@"; do
        dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "ok installed" || missing+=("$package")
    done
    if [ "${#missing[@]}" -gt 0 ]; then
        say "==> Installing Debian packages: ${missing[*]}"
        # Wait up to 10 minutes for another apt or unattended-upgrades to release the dpkg lock.
        local wait_for_lock=(-o DPkg::Lock::Timeout=600)
        quietly as_root apt-get "${wait_for_lock[@]}" update -qq
        quietly as_root env DEBIAN_FRONTEND=noninteractive apt-get "${wait_for_lock[@]}" install -y -qq --no-install-recommends "${missing[@]}"
    fi
}

# Creates .venv (once) and installs this project into it with the given extras, e.g. "[dev]".
ensure_venv() {
    local extras="$1"
    if [ ! -x .venv/bin/python ]; then
        say "==> Creating .venv and upgrading pip in it"
        quietly python3 -m venv .venv
        quietly .venv/bin/pip install --upgrade pip
    fi
    say "==> Installing gpu-cluster-profiler${extras} into .venv (minutes the first time)"
    quietly .venv/bin/pip install -e ".${extras}"
}
