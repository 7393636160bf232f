"""tests/e2e/interrupt.py SIGNAL WAIT_FOR -- COMMAND...: runs COMMAND, waits until a path matching
the glob WAIT_FOR exists (a temporary the command is writing), sends it SIGNAL (INT, TERM or KILL)
and prints its exit status (negative: the signal that ended it). Exit 1 if the command finished
before the path appeared - the caller's input was too small to catch it at work - so a test using
it never passes without having interrupted anything. Used by tests/e2e/test_checkpoint_safety.sh.
"""
import glob
import os
import signal
import subprocess
import sys
import time

sig = getattr(signal, "SIG" + sys.argv[1])
pattern = sys.argv[2]
cmd = sys.argv[4:]
# The signals' default actions in the child, whatever this process inherited (a shell running
# it in the background ignores SIGINT).
def defaults():
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, signal.SIG_DFL)


def forget(p):
    """Removes what LLVM's OpenMP runtime (clang builds) registers per process and a process killed
    by a signal cannot remove: /dev/shm/__KMP_REGISTERED_LIB_<pid>_<uid>. A later process given the
    same pid reads it at start, and one left empty (killed as it wrote it) crashes that process with
    SIGBUS - another test's, whichever gets the pid."""
    p.wait()
    for f in glob.glob(f"/dev/shm/__KMP_REGISTERED_LIB_{p.pid}_*"):
        os.remove(f)


p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=defaults)
deadline = time.monotonic() + 120
while not glob.glob(pattern):
    if p.poll() is not None or time.monotonic() > deadline:
        print(f"finished (status {p.returncode}) before {pattern} appeared", file=sys.stderr)
        p.kill()
        forget(p)
        sys.exit(1)
    time.sleep(0.001)
p.send_signal(sig)
forget(p)
print(p.returncode)
