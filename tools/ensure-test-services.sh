#!/usr/bin/env bash
# The tests start their own private redis-server and docker-registry from the binaries (on free loopback ports), and
# run the README's commands through real bash and zsh shells and redis-cli.
# Install what is missing when we can (root + apt-get); otherwise say exactly what to install.
set -euo pipefail
# binary:package (apt)
needed=(redis-server:redis-server redis-cli:redis-tools docker-registry:docker-registry git:git zsh:zsh)
missing=()
for pair in "${needed[@]}"; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || missing+=("$pair")
done
[ ${#missing[@]} -eq 0 ] && exit 0
packages() { for pair in "$@"; do printf '%s\n' "${pair#*:}"; done | sort -u | tr '\n' ' '; }
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "Installing $(packages "${missing[@]}")with apt-get (the tests run them on loopback)..."
  # shellcheck disable=SC2046  # one word per package
  apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(packages "${missing[@]}") >/dev/null
  still=()
  for pair in "${missing[@]}"; do command -v "${pair%%:*}" >/dev/null 2>&1 || still+=("$pair"); done
  [ ${#still[@]} -eq 0 ] && exit 0
  missing=("${still[@]}")
fi
echo "make test needs $(for p in "${missing[@]}"; do printf '%s ' "${p%%:*}"; done)on PATH and could not install them (not root, or apt-get failed): install them (e.g. 'sudo apt-get install $(packages "${missing[@]}" | sed 's/ $//')') and run make test again." >&2
exit 1
