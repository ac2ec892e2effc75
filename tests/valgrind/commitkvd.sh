#!/bin/sh
# tests/valgrind/commitkvd.sh - commitkvd under valgrind memcheck, for
# `make test-valgrind` (commitkv-bench soak --daemon this, and CKV_TEST_DAEMON_WRAP=this
# for the integration suites).  Any error, and any
# definite or indirect leak at exit, is written to $CKV_VALGRIND_LOGS and makes
# the daemon exit 99.  CKV_DAEMON: the commitkvd binary.
exec valgrind --quiet --leak-check=full --errors-for-leak-kinds=definite,indirect --error-exitcode=99 \
  --log-file="${CKV_VALGRIND_LOGS:?}/commitkvd.%p.log" "${CKV_DAEMON:?}" "$@"
