#!/usr/bin/env python3
"""The live dashboard (GET /dashboard, issue #32) in real headless Chromium (Debian's chromium,
chromium-driver and python3-selenium): a live `lmserve serve` (demo model, CPU) under load on both
lanes; the page loads with no console error and no request to another origin, every chart gets
data, and the numbers it shows match /metrics at the same moment (once the load has stopped,
so that both are still); a screenshot is kept (SCREENSHOT path). With --api-key the dashboard
answers 401 without the key, like the other routes.

  dashboard_test.py serve LMSERVE SOURCE_DIR SCREENSHOT

The gateway's dashboard (GET /dashboard on its admin address) the same way, across two real
replicas behind it: every chart has a series per replica with data, and each replica's output
tokens shown equal that replica's /metrics.

  dashboard_test.py gateway LMSERVE SOURCE_DIR SCREENSHOT
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service

from deploy_common import fail, free_port, free_ports, start_load, stop_processes, wait_ok




def start_serve(lmserve, src, work, extra=()):
    port = free_port()
    log = open(os.path.join(work, f"serve_{port}.log"), "w")
    p = subprocess.Popen([lmserve, "serve", "--model", os.path.join(src, "models", "demo"), "--port", str(port), *extra], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):  # /health answers 503 while the model loads, 200 once it is ready
        try:
            urllib.request.urlopen(url + "/health", timeout=1)
            return p, url
        except OSError:  # HTTPError included
            time.sleep(0.05)
    fail("serve did not start")


def metrics(url):
    out = {}
    for line in urllib.request.urlopen(url + "/metrics", timeout=5).read().decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def chromium():
    """Debian's Chromium, headless, logging the console and the network."""
    opts = Options()
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1400,1800",
              "--no-first-run", "--disable-extensions", "--disable-background-networking", "--disable-component-update",
              "--disable-default-apps", "--disable-sync", "--metrics-recording-only", "--disable-domain-reliability"):
        opts.add_argument(a)
    opts.binary_location = shutil.which("chromium")
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    return webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=opts)


def chart_points(driver):
    """Per chart (canvas id), the number of drawn points of each series."""
    return driver.execute_script("""
      const out = {};
      for (const c of Object.values(Chart.instances)) {
        out[c.canvas.id] = c.data.datasets.map(d => d.data.filter(v => v !== null && v !== undefined && !Number.isNaN(v)).length);
      }
      return out;""")


def shown_figures(driver):
    """The figures above the charts: element id -> the raw value the page shows."""
    return driver.execute_script("""
      const v = {}; for (const el of document.querySelectorAll('.stat')) v[el.id] = el.dataset.value; return v;""")


def cleanup(driver, procs, work):
    if driver is not None:
        driver.quit()
    stop_processes(procs, work)


def check_console_and_origins(driver, url):
    """No console error, and every request the page made went to its own origin."""
    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    if errors:
        fail(f"console errors: {errors}")
    urls = set()
    for entry in driver.get_log("performance"):
        msg = json.loads(entry["message"])["message"]
        if msg.get("method") == "Network.requestWillBeSent":
            urls.add(msg["params"]["request"]["url"])
    foreign = [u for u in urls if not (u.startswith(url + "/") or u.startswith("data:") or u.startswith("about:"))]
    if foreign or not any(u.startswith(url + "/dashboard/chart.js") for u in urls):
        fail(f"requests to other origins: {foreign} (all: {sorted(urls)})")
    print(f"{len(urls)} distinct URLs requested, all on {url}")


def main(lmserve, src, screenshot):
    work = tempfile.mkdtemp(prefix="lmserve_dashboard_test_")
    procs = []
    driver = None
    try:
        # The key rules first: with --api-key, no dashboard without the key.
        keyed, kurl = start_serve(lmserve, src, work, ["--api-key", "sk-dashboard-test"])
        procs.append(keyed)
        for path in ("/dashboard", "/dashboard/data", "/dashboard/chart.js"):
            try:
                urllib.request.urlopen(kurl + path, timeout=5)
                fail(f"{path} answered without the key")
            except urllib.error.HTTPError as e:
                if e.code != 401:
                    fail(f"{path} without the key: {e.code}")
        ok = urllib.request.urlopen(urllib.request.Request(kurl + "/dashboard/data", headers={"Authorization": "Bearer sk-dashboard-test"}), timeout=5)
        if ok.status != 200:
            fail("the dashboard's data with the key")
        keyed.send_signal(signal.SIGTERM)
        keyed.wait(timeout=30)

        serve, url = start_serve(lmserve, src, work)
        procs.append(serve)
        stop, loaders = start_load(url, ("low", "low", "high"), max_tokens=12)

        driver = chromium()
        driver.get(url + "/dashboard")
        # Every chart gets data: at least one dataset with a number in it.
        deadline = time.time() + 40
        state = None
        while time.time() < deadline:
            state = chart_points(driver)
            if len(state) == 7 and all(any(n > 0 for n in v) for v in state.values()):
                # Latency charts: both lanes' p99 once both lanes have answered within the minute.
                if all(n > 0 for n in state["chart-ttft"]) and all(n > 0 for n in state["chart-tpot"]):
                    break
            time.sleep(0.5)
        else:
            fail(f"not every chart got data: {state}")
        print("charts with data (points per series):", state)
        time.sleep(2)  # a few more samples drawn under load
        driver.save_screenshot(screenshot)
        print("screenshot:", screenshot)

        # The numbers shown against /metrics at the same moment: stop the load, let a sample be
        # taken after the last request, and compare.
        stop.set()
        for t in loaders:
            t.join(timeout=30)
        time.sleep(2.5)
        m = metrics(url)
        shown = shown_figures(driver)
        expect = {
            "now-output-total": m['vllm:generation_tokens_total{model_name="demo"}'],
            "now-prompt-total": m['vllm:prompt_tokens_total{model_name="demo"}'],
            "now-kv-usage": m['vllm:kv_cache_usage_perc{model_name="demo"}'],
            "now-running-low": m['lmserve:num_requests_running_lane{model_name="demo",lane="low"}'],
            "now-waiting-high": m['lmserve:num_requests_waiting_lane{model_name="demo",lane="high"}'],
        }
        for k, v in expect.items():
            if k not in shown or shown[k] == "" or float(shown[k]) != v:
                fail(f"{k}: the page shows {shown.get(k)!r}, /metrics says {v}")
        if expect["now-output-total"] < 100:
            fail("the load produced too few tokens")
        print("shown = /metrics:", {k: shown[k] for k in expect})

        check_console_and_origins(driver, url)
    finally:
        cleanup(driver, procs, work)
    print("PASS")


def gateway(lmserve, src, screenshot):
    """The gateway's dashboard across two real replicas behind it."""
    work = tempfile.mkdtemp(prefix="lmserve_gw_dashboard_test_")
    procs = []
    driver = None
    try:
        replicas = []
        for _ in range(2):
            p, u = start_serve(lmserve, src, work)
            procs.append(p)
            replicas.append(u)
        port, admin = free_ports(2)
        cfg = os.path.join(work, "gateway.yaml")
        with open(cfg, "w") as f:
            f.write(f"listen: 127.0.0.1:{port}\nadmin_listen: 127.0.0.1:{admin}\nmodels:\n  - name: demo\n    policy: round_robin\n    backends:\n")
            for i, u in enumerate(replicas):
                f.write(f"      - {{url: {u}, version: v{i + 1}}}\n")
        gw = subprocess.Popen([lmserve, "gateway", "--config", cfg], stdout=open(os.path.join(work, "gateway.log"), "w"), stderr=subprocess.STDOUT)
        procs.append(gw)
        admin_url = f"http://127.0.0.1:{admin}"
        wait_ok(admin_url + "/ready")
        stop, loaders = start_load(f"http://127.0.0.1:{port}", ("low", "low", "high", "low"), max_tokens=12, model="demo")
        driver = chromium()
        driver.get(admin_url + "/dashboard")
        deadline = time.time() + 40
        state = None
        while time.time() < deadline:
            state = chart_points(driver)
            if len(state) == 7 and all(len(v) == 2 and all(n > 0 for n in v) for v in state.values()):
                break
            time.sleep(0.5)
        else:
            fail(f"not every chart got data for both replicas: {state}")
        print("charts with data (points per replica):", state)
        time.sleep(2)
        driver.save_screenshot(screenshot)
        print("screenshot:", screenshot)
        stop.set()
        for t in loaders:
            t.join(timeout=30)
        time.sleep(3.5)  # a replica scrape and a sample after the last request
        shown = shown_figures(driver)
        for u in replicas:
            key = re.sub(r"[^0-9a-zA-Z]", "_", u)
            want = metrics(u)['vllm:generation_tokens_total{model_name="demo"}']
            got = shown.get("now-output-" + key)
            if got in (None, "") or float(got) != want or want <= 0:
                fail(f"{u}: the page shows {got!r} output tokens, its /metrics says {want}")
            if shown.get("now-healthy-" + key) != "1":
                fail(f"{u}: not shown healthy")
        print("per replica, shown = the replica's /metrics:", {u: shown["now-output-" + re.sub(r"[^0-9a-zA-Z]", "_", u)] for u in replicas})
        check_console_and_origins(driver, admin_url)
    finally:
        cleanup(driver, procs, work)
    print("PASS")


if __name__ == "__main__":
    if len(sys.argv) != 5 or sys.argv[1] not in ("serve", "gateway"):
        print(__doc__)
        sys.exit(2)
    {"serve": main, "gateway": gateway}[sys.argv[1]](*sys.argv[2:])
