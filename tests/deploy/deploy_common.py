"""Helpers the deploy tests share (their folder is on sys.path when they run)."""
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request


def fail(msg):
    print("FAIL: " + msg, flush=True)
    sys.exit(1)


def free_ports(n):
    """n distinct loopback ports free at the moment of asking (bound together, so no two are the same)."""
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def free_port():
    """A loopback port free at the moment of asking."""
    return free_ports(1)[0]


def wait_ok(url, seconds=30):
    """Waits until `url` answers 200; fails the test after `seconds`."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            if urllib.request.urlopen(url, timeout=2).status == 200:
                return
        except OSError:
            pass
        time.sleep(0.05)
    fail(f"{url} never answered 200")


def stop_processes(procs, work):
    """SIGTERM to every process still running (SIGKILL after 30 s), then the work folder goes."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
    shutil.rmtree(work, ignore_errors=True)


def start_load(url, lanes, max_tokens=8, model=None):
    """One client thread per entry of `lanes`, each sending completions on its lane to `url` one
    after the other until the returned event is set. Returns (event, threads)."""
    import json
    import threading
    import urllib.request

    stop = threading.Event()

    def load(lane):
        i = 0
        while not stop.is_set():
            request = {"prompt": f"The {lane} request number {i} says", "max_tokens": max_tokens, "ignore_eos": True}
            if model:
                request["model"] = model
            body = json.dumps(request).encode()
            req = urllib.request.Request(url + "/v1/completions", data=body, method="POST",
                                         headers={"Content-Type": "application/json", "x-lmserve-lane": lane})
            try:
                urllib.request.urlopen(req, timeout=30).read()
            except OSError as e:
                print("load:", e)
            i += 1

    threads = [threading.Thread(target=load, args=(lane,), daemon=True) for lane in lanes]
    for t in threads:
        t.start()
    return stop, threads
