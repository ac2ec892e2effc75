#!/bin/sh
# Installs every build and test dependency (clang-14 and its libFuzzer
# runtime for `make fuzz`) from Debian packages, only when missing.
# Quick and silent when everything is present.
set -eu
PKGS="cmake make gcc pkg-config libzmq3-dev libprotobuf-c-dev protobuf-c-compiler libcriterion-dev
python3 python3-dev python3-numpy python3-pytest ccache libsystemd-dev libinih-dev libjansson-dev libmicrohttpd-dev libxxhash-dev libhiredis-dev libsodium-dev redis-server gnuplot-nox valgrind systemd dpkg-dev
clang-14 libclang-rt-14-dev"
missing=""
for p in $PKGS; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing="$missing $p"
  fi
done
[ -z "$missing" ] && exit 0
echo "make deps: installing$missing"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# shellcheck disable=SC2086
$SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
