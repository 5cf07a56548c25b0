"""Runs python/tests modules for ctest: `python3 run.py [--need nacl,torch] test_module ...`.

Exits 77 (ctest SKIP_RETURN_CODE: the test shows as "Skipped", not passed) with the reason when
a module a test needs is missing from this interpreter: python3-nacl and python3-torch are
Debian packages (scripts/setup.sh installs them); run the tests with Debian's /usr/bin/python3.
"""

import importlib
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # python/: the meshlearn package
sys.path.insert(0, HERE)


def main(argv):
    need = []
    if len(argv) > 1 and argv[0] == "--need":
        need = [n for n in argv[1].split(",") if n]
        argv = argv[2:]
    for n in need:
        try:
            importlib.import_module(n)
        except ImportError as e:
            pkg = {"nacl": "python3-nacl", "torch": "python3-torch"}.get(n, n)
            print("SKIPPED: %s cannot import %s (%s); install %s (scripts/setup.sh) or run the "
                  "tests with Debian's /usr/bin/python3" % (sys.executable, n, e, pkg))
            return 77
    suite = unittest.defaultTestLoader.loadTestsFromNames(argv)
    result = unittest.TextTestRunner(verbosity=2).run(suite)
    if not result.wasSuccessful():
        return 1
    if result.skipped and result.testsRun == len(result.skipped):
        return 77
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
