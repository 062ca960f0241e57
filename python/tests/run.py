#!/usr/bin/env python3
"""Runs the Python package's tests (python/tests/test_*.py) with this checkout's package and
prints "python: N passed, N failed" as its last line (tests/run_all.sh sums it).

    run.py [--gpu] [-v] [PATTERN ...]

--gpu: the GPU tests (test_gpu.py) must run: no CUDA-capable torch is a failure, not a skip.
PATTERN: only tests whose id contains one of them. The library is found as the package finds it
($NVFP4MOE_LIBRARY, ...); the CLI of the same build through $NVFP4MOE_CLI or beside the library.
"""

import os
import sys
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))   # the package of this checkout
sys.path.insert(0, str(HERE))          # _util


def iter_tests(suite):
    for t in suite:
        if isinstance(t, unittest.TestSuite):
            yield from iter_tests(t)
        else:
            yield t


def main(argv):
    verbose = "-v" in argv
    patterns = [a for a in argv if not a.startswith("-")]
    if "--gpu" in argv:
        os.environ["NVFP4MOE_TEST_GPU"] = "1"
    loaded = unittest.defaultTestLoader.discover(str(HERE), pattern="test_*.py", top_level_dir=str(HERE))
    suite = unittest.TestSuite(t for t in iter_tests(loaded) if not patterns or any(p in t.id() for p in patterns))
    result = unittest.TextTestRunner(stream=sys.stdout, verbosity=2 if verbose else 1).run(suite)
    failed = len(result.failures) + len(result.errors) + len(result.unexpectedSuccesses)
    skipped = len(result.skipped)
    # a module or class whose set-up failed or skipped is one entry here, but ran no test
    def ran(entries):
        return sum(1 for t, _ in entries if not isinstance(t, unittest.suite._ErrorHolder))
    passed = result.testsRun - ran(result.failures) - ran(result.errors) - len(result.unexpectedSuccesses) \
        - ran(result.skipped)
    for test, why in result.skipped:
        print(f"skipped: {test.id()}: {why}")
    if result.testsRun == 0 and failed == 0:
        failed = 1
        print("no test ran")
    if skipped:
        print(f"python: {skipped} skipped (listed above)")
    print(f"python: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
