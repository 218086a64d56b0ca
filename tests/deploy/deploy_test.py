#!/usr/bin/env python3
"""deploy/systemd and deploy/kubernetes checked (issue #32).

  deploy_test.py systemd LMSERVE SOURCE_DIR      systemd-analyze verify on the units (the binary
      path pointed at the build), no warning allowed; stop timeouts cover serve's drain
  deploy_test.py kubernetes LMSERVE SOURCE_DIR   every manifest against a schema of its kind
      (python3-jsonschema), the references between them (selectors, ports, the HPA's target, the
      gateway's backend naming the headless Service), the grace period covering preStop and the
      drain; then the Deployment's own serve arguments and the gateway ConfigMap's own config run
      for real (model path, addresses and the backend URL pointed at this machine): a completion
      through the gateway, and both drain and exit 0 on SIGTERM
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
import urllib.request

import jsonschema
import yaml

from deploy_common import fail, free_port, free_ports, stop_processes, wait_ok



def systemd(lmserve, src):
    units = os.path.join(src, "deploy", "systemd")
    work = tempfile.mkdtemp(prefix="lmserve_units_")
    try:
        names = sorted(f for f in os.listdir(units) if f.endswith(".service"))
        if names != ["lmserve-gateway.service", "lmserve-serve@.service"]:
            fail(f"unexpected units {names}")
        paths = []
        for n in names:
            text = open(os.path.join(units, n)).read()
            for key, want in (("Restart", "on-failure"), ("KillSignal", "SIGTERM"), ("NoNewPrivileges", "yes"), ("ProtectSystem", "strict")):
                if not re.search(rf"^{key}={want}$", text, re.M):
                    fail(f"{n}: {key}={want} missing")
            stop = int(re.search(r"^TimeoutStopSec=(\d+)$", text, re.M).group(1))
            if stop < 30 + 10:  # serve's and the gateway's drain (--shutdown-timeout 30 s) and a margin
                fail(f"{n}: TimeoutStopSec={stop} is shorter than the drain")
            # An instance of the template, with the build's binary (verify checks the executable).
            out = os.path.join(work, n.replace("@.", "@demo."))
            open(out, "w").write(text.replace("/usr/local/bin/lmserve", os.path.abspath(lmserve))
                                 .replace("EnvironmentFile=/etc/lmserve/serve-%i.env", "EnvironmentFile=-/etc/lmserve/serve-%i.env"))
            paths.append(out)
        p = subprocess.run(["systemd-analyze", "verify"] + paths, capture_output=True, text=True)
        output = (p.stdout + p.stderr).strip()
        print("$ systemd-analyze verify " + " ".join(paths) + "\n" + output)
        if p.returncode != 0 or any(os.path.basename(x) in output for x in paths):
            fail("systemd-analyze verify: " + (output or f"exit {p.returncode}"))
    finally:
        shutil.rmtree(work, ignore_errors=True)


# Schemas of the fields these manifests use (Kubernetes' own, in part: types, required fields,
# enumerations and patterns as the API server checks them); unknown fields are refused, as
# `kubectl apply --validate=strict` does.
NAME = {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 63}
LABELS = {"type": "object", "additionalProperties": {"type": "string", "maxLength": 63}}
META = {"type": "object", "required": ["name"], "additionalProperties": False,
        "properties": {"name": NAME, "namespace": NAME, "labels": LABELS, "annotations": {"type": "object", "additionalProperties": {"type": "string"}}}}
QUANTITY = {"type": "string", "pattern": r"^[0-9]+(\.[0-9]+)?(m|Ki|Mi|Gi|Ti|k|M|G)?$"}
PORT_REF = {"oneOf": [{"type": "integer", "minimum": 1, "maximum": 65535}, NAME]}
PROBE = {"type": "object", "additionalProperties": False, "required": ["httpGet"],
         "properties": {"httpGet": {"type": "object", "required": ["path", "port"], "additionalProperties": False,
                                    "properties": {"path": {"type": "string", "pattern": "^/"}, "port": PORT_REF}},
                        "periodSeconds": {"type": "integer", "minimum": 1}, "timeoutSeconds": {"type": "integer", "minimum": 1},
                        "failureThreshold": {"type": "integer", "minimum": 1}, "initialDelaySeconds": {"type": "integer", "minimum": 0}}}
CONTAINER = {"type": "object", "required": ["name", "image"], "additionalProperties": False, "properties": {
    "name": NAME, "image": {"type": "string", "minLength": 1}, "args": {"type": "array", "items": {"type": "string"}},
    "ports": {"type": "array", "items": {"type": "object", "required": ["containerPort"], "additionalProperties": False,
                                         "properties": {"name": {"type": "string", "maxLength": 15}, "containerPort": {"type": "integer", "minimum": 1, "maximum": 65535},
                                                        "protocol": {"enum": ["TCP", "UDP", "SCTP"]}}}},
    "resources": {"type": "object", "additionalProperties": False, "properties": {
        "requests": {"type": "object", "additionalProperties": QUANTITY}, "limits": {"type": "object", "additionalProperties": QUANTITY}}},
    "startupProbe": PROBE, "livenessProbe": PROBE, "readinessProbe": PROBE,
    "lifecycle": {"type": "object", "additionalProperties": False, "properties": {"preStop": {"type": "object", "additionalProperties": False, "properties": {
        "exec": {"type": "object", "required": ["command"], "properties": {"command": {"type": "array", "items": {"type": "string"}}}}}}}},
    "securityContext": {"type": "object", "additionalProperties": False, "properties": {
        "allowPrivilegeEscalation": {"type": "boolean"}, "readOnlyRootFilesystem": {"type": "boolean"},
        "capabilities": {"type": "object", "properties": {"drop": {"type": "array", "items": {"type": "string"}}}}}},
    "volumeMounts": {"type": "array", "items": {"type": "object", "required": ["name", "mountPath"], "additionalProperties": False,
                                                "properties": {"name": NAME, "mountPath": {"type": "string", "pattern": "^/"}, "readOnly": {"type": "boolean"}}}}}}
SELECTOR = {"type": "object", "required": ["matchLabels"], "additionalProperties": False, "properties": {"matchLabels": LABELS}}
DEPLOYMENT = {"type": "object", "required": ["apiVersion", "kind", "metadata", "spec"], "additionalProperties": False, "properties": {
    "apiVersion": {"const": "apps/v1"}, "kind": {"const": "Deployment"}, "metadata": META,
    "spec": {"type": "object", "required": ["selector", "template"], "additionalProperties": False, "properties": {
        "replicas": {"type": "integer", "minimum": 0}, "selector": SELECTOR,
        "strategy": {"type": "object", "properties": {"type": {"enum": ["RollingUpdate", "Recreate"]}, "rollingUpdate": {"type": "object"}}},
        "template": {"type": "object", "required": ["metadata", "spec"], "additionalProperties": False, "properties": {
            "metadata": {"type": "object", "additionalProperties": False, "properties": {"labels": LABELS, "annotations": {"type": "object"}}},
            "spec": {"type": "object", "required": ["containers"], "additionalProperties": False, "properties": {
                "terminationGracePeriodSeconds": {"type": "integer", "minimum": 0},
                "securityContext": {"type": "object"},
                "containers": {"type": "array", "minItems": 1, "items": CONTAINER},
                "volumes": {"type": "array", "items": {"type": "object", "required": ["name"], "properties": {"name": NAME}}}}}}}}}}}
SERVICE = {"type": "object", "required": ["apiVersion", "kind", "metadata", "spec"], "additionalProperties": False, "properties": {
    "apiVersion": {"const": "v1"}, "kind": {"const": "Service"}, "metadata": META,
    "spec": {"type": "object", "required": ["selector", "ports"], "additionalProperties": False, "properties": {
        "clusterIP": {"type": "string"}, "selector": LABELS, "type": {"enum": ["ClusterIP", "NodePort", "LoadBalancer"]},
        "ports": {"type": "array", "minItems": 1, "items": {"type": "object", "required": ["port"], "additionalProperties": False, "properties": {
            "name": NAME, "port": {"type": "integer", "minimum": 1, "maximum": 65535}, "targetPort": PORT_REF, "protocol": {"enum": ["TCP", "UDP", "SCTP"]}}}}}}}}
PDB = {"type": "object", "required": ["apiVersion", "kind", "metadata", "spec"], "additionalProperties": False, "properties": {
    "apiVersion": {"const": "policy/v1"}, "kind": {"const": "PodDisruptionBudget"}, "metadata": META,
    "spec": {"type": "object", "required": ["selector"], "additionalProperties": False, "properties": {
        "selector": SELECTOR, "maxUnavailable": {"type": ["integer", "string"]}, "minAvailable": {"type": ["integer", "string"]}}}}}
HPA = {"type": "object", "required": ["apiVersion", "kind", "metadata", "spec"], "additionalProperties": False, "properties": {
    "apiVersion": {"const": "autoscaling/v2"}, "kind": {"const": "HorizontalPodAutoscaler"}, "metadata": META,
    "spec": {"type": "object", "required": ["scaleTargetRef", "maxReplicas"], "additionalProperties": False, "properties": {
        "scaleTargetRef": {"type": "object", "required": ["apiVersion", "kind", "name"], "additionalProperties": False,
                           "properties": {"apiVersion": {"type": "string"}, "kind": {"type": "string"}, "name": NAME}},
        "minReplicas": {"type": "integer", "minimum": 1}, "maxReplicas": {"type": "integer", "minimum": 1},
        "metrics": {"type": "array", "items": {"type": "object", "required": ["type"], "properties": {
            "type": {"enum": ["Pods", "Resource", "Object", "External", "ContainerResource"]},
            "pods": {"type": "object", "required": ["metric", "target"], "properties": {
                "metric": {"type": "object", "required": ["name"]},
                "target": {"type": "object", "required": ["type"], "properties": {"type": {"enum": ["AverageValue", "Value", "Utilization"]}, "averageValue": QUANTITY}}}}}}},
        "behavior": {"type": "object"}}}}}
CONFIGMAP = {"type": "object", "required": ["apiVersion", "kind", "metadata", "data"], "additionalProperties": False, "properties": {
    "apiVersion": {"const": "v1"}, "kind": {"const": "ConfigMap"}, "metadata": META, "data": {"type": "object", "additionalProperties": {"type": "string"}}}}
NAMESPACE = {"type": "object", "required": ["apiVersion", "kind", "metadata"], "additionalProperties": False, "properties": {
    "apiVersion": {"const": "v1"}, "kind": {"const": "Namespace"}, "metadata": META}}
SCHEMAS = {"Deployment": DEPLOYMENT, "Service": SERVICE, "PodDisruptionBudget": PDB, "HorizontalPodAutoscaler": HPA, "ConfigMap": CONFIGMAP, "Namespace": NAMESPACE}



def kubernetes(lmserve, src):
    kdir = os.path.join(src, "deploy", "kubernetes")
    docs = []
    for f in sorted(os.listdir(kdir)):
        if f.endswith(".yaml"):
            for d in yaml.safe_load_all(open(os.path.join(kdir, f))):
                if d is not None:
                    docs.append((f, d))
    kinds = {}
    for f, d in docs:
        schema = SCHEMAS.get(d.get("kind"))
        if schema is None:
            fail(f"{f}: unexpected kind {d.get('kind')}")
        try:
            jsonschema.validate(d, schema)
        except jsonschema.ValidationError as e:
            fail(f"{f}: {d['kind']} {d['metadata'].get('name')}: {e.message} at {list(e.absolute_path)}")
        kinds.setdefault(d["kind"], []).append(d)
    print(f"{len(docs)} manifests valid: " + ", ".join(f"{len(v)} {k}" for k, v in sorted(kinds.items())))

    deployments = {d["metadata"]["name"]: d for d in kinds["Deployment"]}
    for d in deployments.values():
        labels = d["spec"]["template"]["metadata"]["labels"]
        if any(labels.get(k) != v for k, v in d["spec"]["selector"]["matchLabels"].items()):
            fail(f"Deployment {d['metadata']['name']}: selector does not match its pods' labels")
        pod = d["spec"]["template"]["spec"]
        c = pod["containers"][0]
        port_names = {p["name"] for p in c.get("ports", []) if "name" in p}
        for probe in ("livenessProbe", "readinessProbe"):
            if probe not in c:
                fail(f"Deployment {d['metadata']['name']}: no {probe}")
            port = c[probe]["httpGet"]["port"]
            if isinstance(port, str) and port not in port_names:
                fail(f"Deployment {d['metadata']['name']}: {probe} port {port} is not a container port")
        if c["livenessProbe"]["httpGet"]["path"] != "/health" or c["readinessProbe"]["httpGet"]["path"] != "/ready":
            fail(f"Deployment {d['metadata']['name']}: liveness must be /health and readiness /ready")
        pre = c["lifecycle"]["preStop"]["exec"]["command"]
        pre_s = int(pre[1]) if pre[0] == "sleep" else 0
        args = c["args"]
        drain = int(args[args.index("--shutdown-timeout") + 1]) if "--shutdown-timeout" in args else 30
        if pod["terminationGracePeriodSeconds"] < pre_s + drain + 5:
            fail(f"Deployment {d['metadata']['name']}: terminationGracePeriodSeconds {pod['terminationGracePeriodSeconds']} < preStop {pre_s} + drain {drain} + 5")
        if args[0] == "serve":
            if "startupProbe" not in c:
                fail(f"Deployment {d['metadata']['name']}: a model server needs a startup probe for the model load")
            if c["resources"]["limits"].get("nvidia.com/gpu") != "1":
                fail(f"Deployment {d['metadata']['name']}: no GPU limit")
    for s in kinds["Service"]:
        sel = s["spec"]["selector"]
        if not any(all(d["spec"]["template"]["metadata"]["labels"].get(k) == v for k, v in sel.items()) for d in deployments.values()):
            fail(f"Service {s['metadata']['name']} selects no Deployment's pods")
    for p in kinds["PodDisruptionBudget"]:
        if not any(d["spec"]["selector"]["matchLabels"] == p["spec"]["selector"]["matchLabels"] for d in deployments.values()):
            fail(f"PodDisruptionBudget {p['metadata']['name']} covers no Deployment")
    for h in kinds["HorizontalPodAutoscaler"]:
        if h["spec"]["scaleTargetRef"]["name"] not in deployments:
            fail(f"HPA {h['metadata']['name']}: no Deployment {h['spec']['scaleTargetRef']['name']}")
    headless = {s["metadata"]["name"] for s in kinds["Service"] if s["spec"].get("clusterIP") == "None"}
    gw_cfg = next(c for c in kinds["ConfigMap"] if "gateway.yaml" in c["data"])["data"]["gateway.yaml"]
    urls = re.findall(r"url: (http://[^,}\s]+)", gw_cfg)
    for u in urls:
        host = u.split("//")[1].split(":")[0]
        if host.split(".")[0] not in headless or not host.endswith(".svc.cluster.local"):
            fail(f"the gateway's backend {u} is not a headless Service's DNS name")
    adapter = next(c for c in kinds["ConfigMap"] if "config.yaml" in c["data"])["data"]["config.yaml"]
    rule = yaml.safe_load(adapter)["rules"][0]
    metric = next(h for h in kinds["HorizontalPodAutoscaler"])["spec"]["metrics"][0]["pods"]["metric"]["name"]
    if rule["name"]["as"] != metric or "vllm:num_requests_waiting" not in rule["seriesQuery"]:
        fail("the Prometheus adapter's rule does not serve the HPA's metric from vllm:num_requests_waiting")

    # The manifests' own arguments and configuration, run here.
    serve_dep = next(d for d in deployments.values() if d["spec"]["template"]["spec"]["containers"][0]["args"][0] == "serve")
    args = list(serve_dep["spec"]["template"]["spec"]["containers"][0]["args"])
    work = tempfile.mkdtemp(prefix="lmserve_k8s_")
    procs = []
    try:
        model_arg = args[args.index("--model") + 1]  # /models/NAME/current
        name = model_arg.split("/")[2]
        vdir = os.path.join(work, "models", name, "v1")
        shutil.copytree(os.path.join(src, "models", "demo"), vdir)
        subprocess.run([lmserve, "model", "manifest", vdir], check=True, capture_output=True)
        subprocess.run([lmserve, "model", "activate", name, "v1", "--root", os.path.join(work, "models")], check=True, capture_output=True)
        args[args.index("--model") + 1] = os.path.join(work, "models", name, "current")
        args[args.index("--host") + 1] = "127.0.0.1"
        serve_port = free_port()
        args[args.index("--port") + 1] = str(serve_port)
        args += ["--max-model-len", "512"]  # the demo model on this machine's CPU
        serve = subprocess.Popen([lmserve] + args, stdout=open(os.path.join(work, "serve.log"), "w"), stderr=subprocess.STDOUT)
        procs.append(serve)
        wait_ok(f"http://127.0.0.1:{serve_port}/ready", 60)
        gw = yaml.safe_load(gw_cfg)
        gw_port, admin_port = free_ports(2)
        gw["listen"] = f"127.0.0.1:{gw_port}"
        gw["admin_listen"] = f"127.0.0.1:{admin_port}"
        for m in gw["models"]:
            for b in m["backends"]:
                b["url"] = f"http://127.0.0.1:{serve_port}"
        cfg = os.path.join(work, "gateway.yaml")
        yaml.safe_dump(gw, open(cfg, "w"))
        gateway = subprocess.Popen([lmserve, "gateway", "--config", cfg], stdout=open(os.path.join(work, "gateway.log"), "w"), stderr=subprocess.STDOUT)
        procs.append(gateway)
        wait_ok(f"http://127.0.0.1:{admin_port}/ready", 30)
        req = urllib.request.Request(f"http://127.0.0.1:{gw_port}/v1/completions", method="POST",
                                     data=json.dumps({"model": name, "prompt": "hello", "max_tokens": 4}).encode(),
                                     headers={"Content-Type": "application/json"})
        body = json.loads(urllib.request.urlopen(req, timeout=30).read())
        if body["usage"]["completion_tokens"] != 4:
            fail(f"completion through the gateway: {body}")
        for p, what in ((gateway, "gateway"), (serve, "serve")):
            t0 = time.time()
            p.send_signal(signal.SIGTERM)
            rc = p.wait(timeout=40)
            print(f"{what}: exit {rc} {time.time() - t0:.2f} s after SIGTERM")
            if rc != 0:
                fail(f"{what} exited {rc} on SIGTERM:\n" + open(os.path.join(work, what + ".log")).read()[-2000:])
        if "model verified" not in open(os.path.join(work, "serve.log")).read():
            fail("serve did not verify the model")
        print("the Deployment's serve arguments and the gateway ConfigMap ran: a completion through the gateway, both drained")
    finally:
        stop_processes(procs, work)


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] not in ("systemd", "kubernetes"):
        print(__doc__)
        sys.exit(2)
    {"systemd": systemd, "kubernetes": kubernetes}[sys.argv[1]](sys.argv[2], sys.argv[3])
    print("PASS")
