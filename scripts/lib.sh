# Shared setup steps for scripts/run and scripts/test (sourced, not executed).

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

# Installs the Debian/Ubuntu packages named, skipping the apt round trip when all are present.
install_system_packages() {
    local missing=()
    for package in "$@"; do
        dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "ok installed" || missing+=("$package")
    done
    if [ "${#missing[@]}" -gt 0 ]; then
        echo "==> Installing Debian packages: ${missing[*]}"
        as_root apt-get update -qq
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
    fi
}

# Creates .venv (once) and installs this project into it with the given extras, e.g. "[dev]".
ensure_venv() {
    local extras="$1"
    if [ ! -x .venv/bin/python ]; then
        echo "==> Creating .venv"
        python3 -m venv .venv
        .venv/bin/pip install -q --upgrade pip
    fi
    echo "==> Installing gpu-cluster-profiler${extras} into .venv"
    .venv/bin/pip install -q -e ".${extras}"
}
