#!/bin/sh
# The compiled event core's tests under AddressSanitizer (issue 14): the extension is
# rebuilt in place with -fsanitize=address, the batch tests (both twins, the hostile
# inputs, the differential fuzz) run with libasan preloaded into the venv's Python,
# then the extension is rebuilt normally. Any out-of-bounds read or write, use after
# free or double free in databus/batch/_native.pyx aborts the run with a report.
#
#     sh benchmarks/native_asan.sh [pytest args...]
#
# Leak detection is off: CPython frees little at exit by design.
set -eu
cd "$(dirname "$0")/.."
PY=.venv/bin/python
LIBASAN=$(gcc -print-file-name=libasan.so)
rebuild() {
    rm -f databus/batch/_native.c databus/batch/_native.*.so
    CFLAGS="$1" LDFLAGS="$2" $PY setup.py -q build_ext --inplace >/dev/null
}
trap 'rebuild "" ""' EXIT
rebuild "-fsanitize=address -fno-omit-frame-pointer -O1 -g" "-fsanitize=address"
nm -D databus/batch/_native.*.so | grep -q __asan_report || {
    echo "the extension was not instrumented" >&2; exit 1; }
ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 LD_PRELOAD="$LIBASAN" PYTHONMALLOC=malloc \
    $PY -m pytest -q -p no:cacheprovider tests/unit/test_batch.py \
    tests/unit/test_event.py "$@"
echo "AddressSanitizer: no error in the compiled event core's tests"
