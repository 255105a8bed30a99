# Leaves a detached daemon behind that keeps rewriting anything that looks like a test.
import os
import time

if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        end = time.monotonic() + 30
        while time.monotonic() < end:
            time.sleep(0.05)
        os._exit(0)
    os._exit(0)
time.sleep(0.1)


def f(xs):
    return 0
