"""A command that does not train stops at once on SIGTERM/SIGINT (KeyboardInterrupt, exit 130). A signal
that lands where Python swallows exceptions (a weakref callback such as importlib's module-lock cleanup,
a __del__) must not be lost with a printed "Exception ignored" traceback: it is asked for again and
lands in the command's own code (CI found a report that went on after SIGTERM this way)."""

import signal
import subprocess
import sys
import time

import pytest

PROGRAM = r'''
import sys, time, weakref
from ecotrain.core.preemption import Preemption
p = Preemption(); p.stop_at_once()
class A: pass
def swallowing(_):
    print("in the callback", flush=True); time.sleep(1.0)   # the signal lands here
a = A(); r = weakref.ref(a, swallowing)
try:
    print("ready", flush=True)
    sys.stdin.readline()
    del a
    for _ in range(300): time.sleep(0.01)
    print("went on")
except KeyboardInterrupt as e:
    print("interrupted", e)
p.uninstall()
print("hook restored", sys.unraisablehook is sys.__unraisablehook__)
'''


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_inside_a_swallowing_callback_still_stops_the_command(sig):
    p = subprocess.Popen([sys.executable, "-c", PROGRAM], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline() == "ready\n"
        p.stdin.write("\n"); p.stdin.flush()
        assert p.stdout.readline() == "in the callback\n"
        time.sleep(0.2)
        p.send_signal(sig)
        out, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert f"interrupted {sig.name}" in out and "went on" not in out, out
    assert "hook restored True" in out
    assert "Traceback" not in err and "Exception ignored" not in err, err
