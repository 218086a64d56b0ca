#!/usr/bin/env python3
"""Soak client for machines without Node (the GPU machine): the same load and the same JSON
summary as soak_client.mjs, with the standard library only (a thread per worker, http.client).

`concurrency` workers send streamed chat completions for `duration` seconds, each asking for a
random number of tokens; a share of the requests is cut off by the client at a random moment.
Every answer is classified: a whole stream ends with `data: [DONE]`; one with an error event
counts in errorEvents; 429 / 503 are waited out (Retry-After, at most 2 s). With RETRY_REFUSED,
a refused connection (the server restarting) is counted in `refused` and sent again after 200 ms.

Usage: soak_client.py URL DURATION_S CONCURRENCY ABORT_FRACTION [RETRY_REFUSED]
"""
import http.client
import json
import random
import sys
import threading
import time
import urllib.parse

url, duration_s, concurrency, abort_fraction = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
retry_refused = len(sys.argv) > 5 and sys.argv[5] != ""
until = time.monotonic() + duration_s
words = ["kernel", "bank", "audit", "memory", "river", "model", "token", "compliance", "report", "cache"]
counts = dict(ok=0, errorEvents=0, cut=0, status429=0, status503=0, otherStatus=0, unfinished=0, networkErrors=0, refused=0)
other = {}
lock = threading.Lock()
target = urllib.parse.urlsplit(url)


def count(key, status=None):
    with lock:
        counts[key] += 1
        if status is not None:
            other[str(status)] = other.get(str(status), 0) + 1


def one():
    prompt = " ".join(random.choice(words) for _ in range(3 + random.randrange(30)))
    body = json.dumps({"model": "demo", "messages": [{"role": "user", "content": prompt}], "stream": True,
                       "max_tokens": 8 + random.randrange(120)})
    conn = http.client.HTTPConnection(target.hostname, target.port, timeout=120)
    cut = random.random() < abort_fraction
    timer = threading.Timer(random.random() * 2, conn.close) if cut else None
    try:
        conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        if timer:
            timer.start()
        res = conn.getresponse()
        if res.status in (429, 503):
            res.read()
            count("status429" if res.status == 429 else "status503")
            try:
                after = float(res.getheader("retry-after") or 0)
            except ValueError:
                after = 0
            time.sleep(min(after, 2) if after > 0 else 0.3 + random.random() * 0.4)
            return
        if res.status != 200:
            res.read()
            count("otherStatus", res.status)
            return
        text = res.read().decode("utf-8", "replace")
        if timer and not timer.is_alive() and not text.rstrip().endswith("data: [DONE]"):
            count("cut")  # the timer closed the connection under the read
        elif not text.rstrip().endswith("data: [DONE]"):
            count("unfinished")
        elif 'data: {"error"' in text:
            count("errorEvents")
        else:
            count("ok")
    except ConnectionRefusedError:
        if retry_refused:
            count("refused")
            time.sleep(0.2)
        else:
            count("networkErrors")
    except (OSError, http.client.HTTPException, AttributeError, ValueError):
        # A read on a connection the timer closed fails in one of these ways.
        if timer and not timer.is_alive():
            count("cut")
        else:
            count("networkErrors")
    finally:
        if timer:
            timer.cancel()
        conn.close()


def worker():
    while time.monotonic() < until:
        one()


threads = [threading.Thread(target=worker) for _ in range(concurrency)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps({**counts, "otherStatuses": other}))
