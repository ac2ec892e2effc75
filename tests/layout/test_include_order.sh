#!/bin/sh
# test_include_order.sh SOURCE_DIR - run by ctest: the sources keep the rooms'
# order (check_includes.py), and the checker itself still catches what it is
# for, on small trees made here: a store/ file including daemon/, a circle
# between two folders, a client including the log, a new circle in a folder.
set -u
src=$1
py=/usr/bin/python3
[ -x "$py" ] || py=python3
check="$src/tests/layout/check_includes.py"
"$py" "$check" "$src" || { echo "FAIL: the sources break the include order (above)"; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
expect_violation() { # name, then files as path=content pairs
  name=$1
  shift
  d="$tmp/$name"
  for pair in "$@"; do
    p=${pair%%=*}
    mkdir -p "$d/$(dirname "$p")"
    printf '%s\n' "${pair#*=}" >"$d/$p"
  done
  if "$py" "$check" "$d" >"$d.out" 2>&1; then
    echo "FAIL: $name was not caught:"
    cat "$d.out"
    fails=$((fails + 1))
  else
    echo "ok: $name caught: $(grep -m1 'check_includes: [a-z]*/' "$d.out")"
  fi
}
expect_violation store_includes_daemon 'store/a.c=#include "daemon/b.h"' 'daemon/b.h=int b;'
expect_violation persist_includes_daemon 'persist/a.c=#include "daemon/b.h"' 'daemon/b.h=int b;'
expect_violation store_includes_persist 'store/a.c=#include "persist/b.h"' 'persist/b.h=int b;'
expect_violation lifecycle_includes_store 'lifecycle/a.c=#include "store/b.h"' 'store/b.h=int b;'
expect_violation bench_includes_daemon 'bench/a.c=#include "daemon/b.h"' 'daemon/b.h=int b;'
expect_violation client_includes_log 'client/a.c=#include "common/log.h"' 'common/log.h=int b;'
expect_violation folder_circle 'kernels/a.h=#include "shm/b.h"' 'shm/b.h=#include "kernels/a.h"'
expect_violation module_circle 'store/a.c=#include "store/b.h"' 'store/a.h=int a;' 'store/b.c=#include "store/a.h"' \
  'store/b.h=int b;'
if [ "$fails" -ne 0 ]; then
  echo "FAIL: $fails hostile trees passed the checker"
  exit 1
fi
echo "include order: sources clean, 8 hostile trees caught"
