"""The TAP harness of tests/test_reduce.py and tests/test_reduce_mmap.py:
the program under test (REDUCE_BIN, under MPIEXEC for more than one rank),
a scratch folder under TMPDIR, and the ok / not ok lines with their count.

Environment: REDUCE_BIN (the program), MPIEXEC, TMPDIR.
"""
import os
import subprocess
import sys
import tempfile

BIN = os.environ["REDUCE_BIN"]
MPIEXEC = os.environ.get("MPIEXEC", "mpiexec")
TMP = None
n_test = 0
failed = 0


def init(prefix):
    """Make the scratch folder (prefix: the test's name); returns it."""
    global TMP
    TMP = tempfile.mkdtemp(prefix=prefix, dir=os.environ.get("TMPDIR", "/tmp"))
    return TMP


def tap(ok, name, detail=""):
    """One TAP line; a failure prints up to 30 lines of detail as comments."""
    global n_test, failed
    n_test += 1
    if not ok:
        failed += 1
        for line in str(detail).splitlines()[:30]:
            print("# " + line)
    print(("ok %d - %s" if ok else "not ok %d - %s") % (n_test, name))
    sys.stdout.flush()


def path(name):
    return os.path.join(TMP, name)


def run(args, np_=1, check=True, env=None):
    """REDUCE_BIN with args on np_ ranks; its output in .stdout (stderr
    merged). check: a non-zero exit raises RuntimeError with the output."""
    cmd = ([MPIEXEC, "-n", str(np_)] if np_ > 1 else []) + [BIN] + [str(a) for a in args]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=600, env=env)
    if check and p.returncode != 0:
        raise RuntimeError("%s -> exit %d\n%s" % (" ".join(cmd), p.returncode, p.stdout))
    return p
