#!/usr/bin/env bash
# Install Debian packages the tests need (make system-deps), non-interactively, without starting
# their services: Debian's prometheus package would otherwise start a server on :9090 through
# invoke-rc.d. A policy-rc.d that denies every start is put in place for the install and the
# previous one (if any) restored afterwards. Runs as root (CI, the dev container).
set -euo pipefail
policy=/usr/sbin/policy-rc.d
backup="$policy.gpuprof-$$"
restore() {
  rm -f "$policy"
  if [ -e "$backup" ]; then mv "$backup" "$policy"; fi
}
if [ -e "$policy" ]; then mv "$policy" "$backup"; fi
trap restore EXIT
printf '#!/bin/sh\n# written by gpuprof scripts/apt_install.sh for the length of an install\nexit 101\n' > "$policy"
chmod 755 "$policy"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
  -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "$@" >/dev/null
