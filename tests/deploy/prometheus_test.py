#!/usr/bin/env python3
"""deploy/prometheus and deploy/grafana against the real tools (issue #32).

  prometheus_test.py rules LMSERVE SOURCE_DIR   promtool check config, check rules, test rules
  prometheus_test.py scrape LMSERVE SOURCE_DIR  Debian's prometheus scrapes a live `lmserve serve`
      (demo model, CPU, under load): its metrics come back through the query API, and every query
      of the Grafana dashboard parses and runs there.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

from deploy_common import fail, free_port, start_load, stop_processes



def run(cmd, cwd=None):
    p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    print("$ " + " ".join(cmd) + "\n" + p.stdout + p.stderr, flush=True)
    if p.returncode != 0:
        fail(" ".join(cmd) + f" exited {p.returncode}")
    return p.stdout + p.stderr


def rules(lmserve, src):
    prom = os.path.join(src, "deploy", "prometheus")
    run(["promtool", "check", "config", "prometheus.yml"], cwd=prom)
    out = run(["promtool", "check", "rules", "alerts.yml"], cwd=prom)
    if "SUCCESS: 7 rules found" not in out:
        fail("alerts.yml: expected 7 rules")
    out = run(["promtool", "test", "rules", "alerts_test.yml"], cwd=prom)
    if "SUCCESS" not in out:
        fail("promtool test rules")
    # Every alert has a runbook section, a summary and a description, and a unit test.
    alerts = re.findall(r"^\s+- alert: (\w+)", open(os.path.join(prom, "alerts.yml")).read(), re.M)
    tests = open(os.path.join(prom, "alerts_test.yml")).read()
    runbook = open(os.path.join(src, "docs", "runbook.md")).read()
    for a in alerts:
        if f"## {a}" not in runbook:
            fail(f"docs/runbook.md has no section for {a}")
        if f"alertname: {a}" not in tests:
            fail(f"alerts_test.yml does not test {a}")
    print(f"{len(alerts)} alerts, each with a runbook section and tests")



def get(url, timeout=10):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def query(prom, expr):
    body = json.loads(get(f"{prom}/api/v1/query?" + urllib.parse.urlencode({"query": expr})))
    if body.get("status") != "success":
        fail(f"query {expr!r}: {body}")
    return body["data"]["result"]


def scrape(lmserve, src):
    work = tempfile.mkdtemp(prefix="lmserve_prom_test_")
    procs = []
    try:
        serve_log = open(os.path.join(work, "serve.log"), "w")
        serve = subprocess.Popen([lmserve, "serve", "--model", os.path.join(src, "models", "demo"), "--port", "0"],
                                 stdout=serve_log, stderr=subprocess.STDOUT)
        procs.append(serve)
        url = None
        for _ in range(200):
            m = re.search(r"on (http://127\.0\.0\.1:\d+)", open(os.path.join(work, "serve.log")).read())
            if m:
                url = m.group(1)
                break
            time.sleep(0.05)
        if not url:
            fail("serve did not start: " + open(os.path.join(work, "serve.log")).read())
        target = url.split("//")[1]

        stop, loaders = start_load(url, ("high", "low", "low"))  # short completions on both lanes while Prometheus scrapes

        # The shipped scrape config with the test's target and a fast interval.
        cfg = open(os.path.join(src, "deploy", "prometheus", "prometheus.yml")).read()
        cfg = cfg.replace('["127.0.0.1:8000"]', f'["{target}"]').replace("scrape_interval: 5s", "scrape_interval: 1s")
        cfg = cfg.replace("evaluation_interval: 15s", "evaluation_interval: 1s")
        open(os.path.join(work, "prometheus.yml"), "w").write(cfg)
        shutil.copy(os.path.join(src, "deploy", "prometheus", "alerts.yml"), work)
        port = free_port()
        prom = f"http://127.0.0.1:{port}"
        prom_log = open(os.path.join(work, "prometheus.log"), "w")
        procs.append(subprocess.Popen(["prometheus", "--config.file", os.path.join(work, "prometheus.yml"),
                                       "--storage.tsdb.path", os.path.join(work, "data"),
                                       "--web.listen-address", f"127.0.0.1:{port}"], stdout=prom_log, stderr=subprocess.STDOUT))
        # Up, and a rate over several scrapes of tokens generated under the load.
        deadline = time.time() + 60
        while True:
            try:
                up = query(prom, f'up{{job="lmserve",instance="{target}"}}')
                rate = query(prom, 'sum(rate(vllm:generation_tokens_total{job="lmserve"}[10s]))')
                if up and up[0]["value"][1] == "1" and rate and float(rate[0]["value"][1]) > 0:
                    break
            except (OSError, ValueError):
                pass
            if time.time() > deadline:
                fail("Prometheus never saw serve up with tokens flowing:\n" + open(os.path.join(work, "prometheus.log")).read()[-3000:])
            time.sleep(0.5)
        print(f"Prometheus scrapes {target}: up, output tokens/s {float(rate[0]['value'][1]):.1f}")
        for name in ["vllm:num_requests_running", "vllm:kv_cache_usage_perc", "vllm:e2e_request_latency_seconds_bucket",
                     "lmserve:engine_alive", "lmserve:lane_queue_capacity", "lmserve:num_requests_waiting_lane",
                     "lmserve:lane_time_to_first_token_seconds_bucket", "lmserve:http_requests_total"]:
            if not query(prom, f'{name}{{job="lmserve"}}'):
                fail(f"{name}: no series in Prometheus")
        alive = query(prom, 'lmserve:engine_alive{job="lmserve"}')
        if alive[0]["value"][1] != "1":
            fail("engine_alive is not 1")
        # The rules loaded, and none is firing against a healthy replica.
        groups = json.loads(get(f"{prom}/api/v1/rules"))["data"]["groups"]
        loaded = [r["name"] for g in groups for r in g["rules"]]
        if len(loaded) != 7 or any(r.get("health") == "err" for g in groups for r in g["rules"]):
            fail(f"rules not loaded cleanly: {groups}")
        firing = [r["name"] for g in groups for r in g["rules"] if r.get("state") == "firing"]
        if firing:
            fail(f"alerts firing against a healthy replica: {firing}")
        # Every Grafana query parses and runs in the same Prometheus, with the variables set to all.
        dash = json.load(open(os.path.join(src, "deploy", "grafana", "lmserve-dashboard.json")))
        exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
        exprs += [v["query"]["query"] for v in dash["templating"]["list"] if isinstance(v.get("query"), dict)]
        with_data = 0
        for e in exprs:
            q = e.replace("$__rate_interval", "10s").replace("$instance", ".*").replace("$model", ".*").replace("$gateway_job", "lmserve-gateway")
            if q.startswith("label_values("):
                metric, label = re.match(r"label_values\(([^,]+), (\w+)\)", q).groups()
                values = json.loads(get(f"{prom}/api/v1/label/{label}/values?" + urllib.parse.urlencode({"match[]": metric})))["data"]
                if not values:
                    fail(f"{e}: no values")
                continue
            if query(prom, q):
                with_data += 1
        print(f"{len(exprs)} dashboard queries parse and run; {with_data} have data from one CPU replica without a gateway")
        if with_data < 10:
            fail("too few dashboard queries have data")
        stop.set()
    finally:
        stop_processes(procs, work)


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] not in ("rules", "scrape"):
        print(__doc__)
        sys.exit(2)
    {"rules": rules, "scrape": scrape}[sys.argv[1]](sys.argv[2], sys.argv[3])
    print("PASS")
