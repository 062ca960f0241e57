#!/usr/bin/env bash
# tests/python.sh - the Python package's tests (python/tests/run.py) for tests/run_all.sh, with the
# Python that has numpy: $NVFP4MOE_PYTHON, default Debian's /usr/bin/python3 (whose python3-numpy
# `make deps` installs). The library and CLI under test: $NVFP4MOE_LIBRARY and $NVFP4MOE_CLI.
exec "${NVFP4MOE_PYTHON:-/usr/bin/python3}" "$(dirname "$0")/../python/tests/run.py" "$@"
