#!/usr/bin/env python3
"""Checks the Helm chart deploy/helm/kvroute with the real helm (`make helm-check`; helm from
`make helm`, tools/install_helm.py):

* `helm lint --strict` and `helm template` with every examples/*.yaml values file; each rendered
  document is validated as tools/check_manifests.py validates the kustomize overlays (Kubernetes'
  strict schemas, the Istio, Gateway API and Prometheus Operator CRDs of deploy/schemas);
* each example renders the same objects as its kustomize overlay (examples/X.yaml against
  overlays/X, the overlay's placeholders replaced by the example's values, the chart's own
  labels left out, kvroute's configuration compared as JSON); objects only the overlay has must be
  listed in ONLY_IN_OVERLAY (the autoscaling components), objects only the chart has are named;
* the monitoring objects carry deploy/monitoring's rules and dashboard unchanged;
* the unedited values.yaml fails, naming each placeholder value; so do an unknown key, a misspelt
  kvroute configuration field, and a configuration whose pools miss the pool Service; with the
  multi-node layout (modelServers.layout lws), the placeholders, a pool Service other than the
  leaders', a one-pod group and a misspelt lws key;
* the InferencePool source: examples/inference-pool.yaml, which tools/inferencepool.py
  --helm-values writes from deploy/inferencepool/example.yaml, renders the same Service and
  EnvoyFilters as the generator writes from that manifest; and the generator, given the
  gateway-api overlay's pool as an InferencePool with its HTTPRoute, writes that overlay's Service,
  HTTPRoute and EnvoyFilter;
* the chart's copies stay equal to their sources: files/ to deploy/monitoring, and the kvroute
  configuration schema in values.schema.json ($defs) to deploy/schemas/kvroute-config.schema.json
  (`--sync` rewrites both copies from their sources).

    .tools/venv/bin/python tools/check_helm.py --out dist/helm     # and write each rendering
    .tools/venv/bin/python tools/check_helm.py --sync              # refresh the chart's copies

Exit status 1 when anything fails, one line per failure.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHART = os.path.join(ROOT, "deploy/helm/kvroute")
CONFIG_SCHEMA = os.path.join(ROOT, "deploy/schemas/kvroute-config.schema.json")
# The chart's copies of files outside it (helm reads nothing outside the chart directory).
COPIES = {
    "files/kvroute-rules.yaml": "deploy/monitoring/kvroute-rules.yaml",
    "files/grafana-dashboard.json": "deploy/monitoring/grafana-dashboard.json",
}
# The kustomize component monitoring's objects made from deploy/monitoring (kustomize, like helm,
# loads no file outside its directory): what the chart renders with monitoring.labels
# {release: kube-prometheus-stack} and its other monitoring values at their defaults.
MONITORING = "deploy/kustomize/components/monitoring"
MONITORING_LABELS = {"release": "kube-prometheus-stack"}
GENERATED_HEADER = ("# Generated from {source} by `tools/check_helm.py --sync`\n"
                    "# (make helm-check fails when it differs): edit that file, then sync. {what}\n")


def monitoring_rule():
    with open(os.path.join(ROOT, COPIES["files/kvroute-rules.yaml"])) as f:
        rules = f.read()
    body = "".join(f"  {line}" if line.strip() else line for line in rules.splitlines(True))
    labels = "".join(f"    {k}: {v}\n" for k, v in MONITORING_LABELS.items())
    return (GENERATED_HEADER.format(source=COPIES["files/kvroute-rules.yaml"],
                                    what="Its spec is that file.")
            + "apiVersion: monitoring.coreos.com/v1\nkind: PrometheusRule\nmetadata:\n"
            + "  name: kvroute\n  namespace: istio-system\n  labels:\n" + labels
            + "spec:\n" + body)


def monitoring_dashboard():
    with open(os.path.join(ROOT, COPIES["files/grafana-dashboard.json"])) as f:
        dashboard = f.read().rstrip("\n")
    body = "".join(f"    {line}" if line.strip() else line for line in dashboard.splitlines(True))
    labels = "".join(f"    {k}: {v}\n" for k, v in MONITORING_LABELS.items())
    return (GENERATED_HEADER.format(source=COPIES["files/grafana-dashboard.json"],
                                    what="For Grafana's dashboard sidecar.")
            + "apiVersion: v1\nkind: ConfigMap\nmetadata:\n"
            + "  name: kvroute-dashboard\n  namespace: istio-system\n  labels:\n" + labels
            + '    grafana_dashboard: "1"\n'
            + "data:\n  kvroute-dashboard.json: |-\n" + body + "\n")


# Files made from others (path under ROOT -> its text now).
GENERATED = {
    f"{MONITORING}/prometheusrule.yaml": monitoring_rule,
    f"{MONITORING}/grafana-dashboard.yaml": monitoring_dashboard,
}
# examples/NAME.yaml renders the objects of overlays/NAME, but for these (kind, name).
ONLY_IN_OVERLAY = {
    ("HorizontalPodAutoscaler", "vllm-prefill"): "components/autoscaling-hpa",
    ("HorizontalPodAutoscaler", "vllm-decode"): "components/autoscaling-hpa",
    ("ConfigMap", "prometheus-adapter-kvroute"): "components/autoscaling-hpa (the Prometheus adapter's rules)",
    ("ScaledObject", "vllm-prefill"): "components/autoscaling-keda",
    ("ScaledObject", "vllm-decode"): "components/autoscaling-keda",
}
# The labels the chart adds to every object's metadata.
CHART_LABELS = ("app.kubernetes.io/name", "app.kubernetes.io/instance",
                "app.kubernetes.io/managed-by", "helm.sh/chart")


def config_defs():
    """kvroute's configuration schema as values.schema.json carries it: its $defs, and the root
    as $defs.KvrouteConfig (its refs, #/$defs/X, resolve the same there)."""
    with open(CONFIG_SCHEMA) as f:
        schema = json.load(f)
    defs = dict(schema.pop("$defs", {}))
    schema.pop("$schema", None)
    defs["KvrouteConfig"] = schema
    return defs


def synced_values_schema():
    """values.schema.json with its kvroute-configuration $defs replaced from the source."""
    path = os.path.join(CHART, "values.schema.json")
    with open(path) as f:
        values = json.load(f)
    ours = {k: v for k, v in values.get("$defs", {}).items() if k[:1].islower()}
    theirs = config_defs()
    assert not set(ours) & set(theirs), "the chart's own $defs start with a lower-case letter"
    values["$defs"] = {**ours, **theirs}
    return path, json.dumps(values, indent=2) + "\n"


def check_copies(sync):
    failures = []
    path, text = synced_values_schema()
    with open(path) as f:
        current = f.read()
    if current != text:
        if sync:
            with open(path, "w") as f:
                f.write(text)
            print(f"synced {os.path.relpath(path, ROOT)} from {os.path.relpath(CONFIG_SCHEMA, ROOT)}")
        else:
            failures.append(f"{os.path.relpath(path, ROOT)}: its kvroute configuration $defs differ "
                            f"from {os.path.relpath(CONFIG_SCHEMA, ROOT)} (run tools/check_helm.py --sync)")
    for copy, source in COPIES.items():
        copy_path, source_path = os.path.join(CHART, copy), os.path.join(ROOT, source)
        with open(source_path, "rb") as f:
            want = f.read()
        have = open(copy_path, "rb").read() if os.path.exists(copy_path) else None
        if have != want:
            if sync:
                os.makedirs(os.path.dirname(copy_path), exist_ok=True)
                shutil.copyfile(source_path, copy_path)
                print(f"synced deploy/helm/kvroute/{copy} from {source}")
            else:
                failures.append(f"deploy/helm/kvroute/{copy} differs from {source} "
                                "(run tools/check_helm.py --sync)")
    for path, make in GENERATED.items():
        full = os.path.join(ROOT, path)
        want = make()
        have = open(full).read() if os.path.exists(full) else None
        if have != want:
            if sync:
                os.makedirs(os.path.dirname(full), exist_ok=True)
                with open(full, "w") as f:
                    f.write(want)
                print(f"synced {path}")
            else:
                failures.append(f"{path} is not what deploy/monitoring makes of it "
                                "(run tools/check_helm.py --sync)")
    return failures


if __name__ == "__main__" and "--sync" in sys.argv[1:] and len(sys.argv) == 2:
    # Needs only the standard library (make config-schema calls it).
    for line in check_copies(sync=True):
        print(line)
    sys.exit(0)

import yaml  # noqa: E402  (the rest needs the venv: make tools)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_manifests  # noqa: E402


def helm(binary, *args):
    out = subprocess.run([binary, *args], capture_output=True, text=True, stdin=subprocess.DEVNULL)
    return out.returncode, out.stdout, out.stderr


def docs(text):
    return [d for d in yaml.safe_load_all(text) if d is not None]


def key(doc):
    meta = doc.get("metadata") or {}
    return (doc.get("kind"), meta.get("namespace"), meta.get("name"))


def normalized(doc):
    """The document without the chart's labels, kvroute's configuration parsed."""
    doc = json.loads(json.dumps(doc))
    meta = doc.get("metadata") or {}
    labels = {k: v for k, v in (meta.get("labels") or {}).items() if k not in CHART_LABELS}
    if labels:
        meta["labels"] = labels
    else:
        meta.pop("labels", None)
    if doc.get("kind") == "EnvoyFilter":
        for patch in doc["spec"]["configPatches"]:
            config = (patch.get("patch", {}).get("value", {}).get("typed_config") or {}).get("config")
            if config and "configuration" in config:
                config["configuration"]["value"] = json.loads(config["configuration"]["value"])
    return doc


def first_difference(a, b, path=""):
    if type(a) is not type(b):
        return f"{path or '(document)'}: {json.dumps(a)[:120]} vs {json.dumps(b)[:120]}"
    if isinstance(a, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                return f"{path}.{k}: only in the {'chart' if k in a else 'overlay'}"
            d = first_difference(a[k], b[k], f"{path}.{k}")
            if d:
                return d
        return None
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{path}: {len(a)} items vs {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            d = first_difference(x, y, f"{path}[{i}]")
            if d:
                return d
        return None
    return None if a == b else f"{path}: {json.dumps(a)[:120]} vs {json.dumps(b)[:120]}"


def compare_with_overlay(name, rendered, values, kustomize):
    """Failures: where examples/NAME.yaml's objects differ from overlays/NAME's."""
    text = check_manifests.render(os.path.join(kustomize, "overlays", name))
    m = values.get("modelServers", {})
    for placeholder, value in [("REGISTRY/kvroute:TAG", values["module"]["image"]),
                               ("MANIFEST_DIGEST", values["module"]["sha256"]),
                               ("vllm/vllm-openai:VLLM_VERSION", m.get("image")),
                               ("MODEL_NAME", m.get("model"))]:
        if value is not None:
            text = text.replace(placeholder, value)
    overlay = {key(d): normalized(d) for d in docs(text)}
    chart = {key(d): normalized(d) for d in rendered}
    failures, only_chart = [], []
    for k, doc in overlay.items():
        if k not in chart:
            if (k[0], k[2]) not in ONLY_IN_OVERLAY:
                failures.append(f"{k[0]} {k[1]}/{k[2]} of overlays/{name} is not rendered by the chart")
            continue
        diff = first_difference(chart[k], doc)
        if diff:
            failures.append(f"{k[0]} {k[1]}/{k[2]} differs from overlays/{name}: {diff}")
    for k in chart:
        if k not in overlay:
            only_chart.append(f"{k[0]} {k[1]}/{k[2]}")
    return failures, only_chart


# The pool Service's cluster in deploy/monitoring/kvroute-rules.yaml, which the chart and the
# kustomize component monitoring replace with the deployment's (the fallback ratio's parameter).
DEFAULT_POOL_CLUSTER = "outbound|8000||vllm.models.svc.cluster.local"


def check_monitoring(rendered, values):
    failures = []
    with open(os.path.join(ROOT, "deploy/monitoring/kvroute-rules.yaml")) as f:
        rules = yaml.safe_load(f)
    with open(os.path.join(ROOT, "deploy/monitoring/grafana-dashboard.json")) as f:
        dashboard = json.load(f)
    pool = {"service": "vllm.models.svc.cluster.local", "port": 8000, **values.get("pool", {})}
    ip = values.get("inferencePool") or {}
    if ip.get("name"):
        service = ip.get("serviceName") or f"{ip['name']}-kvroute"
        pool = {"service": f"{service}.{ip['namespace']}.svc.{ip.get('clusterDomain', 'cluster.local')}",
                "port": ip["targetPorts"][0]["number"]}
    defaults = [r for r in rules["groups"][0]["rules"] if r.get("record") == "kvroute:pool_cluster:info"
                and r["labels"]["envoy_cluster_name"] == DEFAULT_POOL_CLUSTER]
    if len(defaults) != 1:
        failures.append(f"deploy/monitoring/kvroute-rules.yaml: no kvroute:pool_cluster:info rule "
                        f"for {DEFAULT_POOL_CLUSTER} (what the chart replaces)")
    for rule in defaults:
        rule["labels"]["envoy_cluster_name"] = f"outbound|{int(pool['port'])}||{pool['service']}"
    for doc in rendered:
        if doc["kind"] == "PrometheusRule" and doc["spec"] != rules:
            failures.append("PrometheusRule: spec is not deploy/monitoring/kvroute-rules.yaml with "
                            "the pool Service's cluster (outbound|pool.port||pool.service)")
        if doc["kind"] == "ConfigMap" and doc["metadata"]["name"] == "kvroute-dashboard":
            if json.loads(doc["data"]["kvroute-dashboard.json"]) != dashboard:
                failures.append("ConfigMap kvroute-dashboard: not deploy/monitoring/grafana-dashboard.json")
    return failures


INFERENCEPOOL_TOOL = os.path.join(ROOT, "tools/inferencepool.py")
INFERENCEPOOL_MANIFEST = os.path.join(ROOT, "deploy/inferencepool/example.yaml")
# The gateway-api overlay's pool (components/vllm-pool, overlays/gateway-api) as a GIE user would
# give it: an InferencePool and the HTTPRoute to it on the overlay's Gateway.
OVERLAY_AS_POOL = """
apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata: {name: vllm, namespace: models}
spec:
  targetPorts: [{number: 8000}]
  selector: {matchLabels: {app: vllm}}
  endpointPickerRef: {name: vllm-epp, port: {number: 9002}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: inference, namespace: models}
spec:
  gatewayClassName: istio
  listeners: [{name: http, port: 80, protocol: HTTP}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: vllm, namespace: models}
spec:
  parentRefs: [{name: inference}]
  rules:
  - matches: [{path: {type: PathPrefix, value: /}}]
    backendRefs: [{group: inference.networking.k8s.io, kind: InferencePool, name: vllm}]
    timeouts: {request: "0s"}
"""


def inferencepool(values, *args, stdin=None):
    """tools/inferencepool.py with the module of `values` (its output's documents, or its text)."""
    cmd = [sys.executable, INFERENCEPOOL_TOOL, "--image", values["module"]["image"],
           "--sha256", values["module"]["sha256"], *args]
    out = subprocess.run(cmd, capture_output=True, text=True, input=stdin)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[1:])}: {out.stderr.strip()}")
    return out.stdout


def same_objects(have, want, have_label, want_label):
    """Failures: each of `want`'s objects missing from `have` or different there."""
    have = {key(d): normalized(d) for d in have}
    failures = []
    for doc in want:
        k = key(doc)
        if k not in have:
            failures.append(f"{k[0]} {k[1]}/{k[2]} of {want_label} is not in {have_label}")
            continue
        diff = first_difference(have[k], normalized(doc))
        if diff:
            failures.append(f"{k[0]} {k[1]}/{k[2]}: {have_label} differs from {want_label}: {diff}")
    return failures


def compare_with_generator(rendered, values, example):
    """Failures: where an InferencePool example differs from what tools/inferencepool.py writes for
    deploy/inferencepool/example.yaml (its objects but the user's HTTPRoute, which the chart leaves
    to the user, and its --helm-values)."""
    manifest = os.path.relpath(INFERENCEPOOL_MANIFEST, ROOT)
    generated = [d for d in docs(inferencepool(values, INFERENCEPOOL_MANIFEST)) if d["kind"] != "HTTPRoute"]
    failures = same_objects(rendered, generated, f"helm/{example}", f"tools/inferencepool.py {manifest}")
    wanted = yaml.safe_load(inferencepool(values, INFERENCEPOOL_MANIFEST, "--helm-values"))
    for k, v in wanted.items():
        if values.get(k) != v:
            failures.append(f"{k}: not what `tools/inferencepool.py {manifest} --helm-values` writes: "
                            f"{json.dumps(v)[:200]}")
    return failures


def check_generator_overlay(values, kustomize):
    """Failures: where the generator, given the gateway-api overlay's pool as an InferencePool,
    writes other objects than that overlay (placeholders replaced by `values`' module)."""
    text = check_manifests.render(os.path.join(kustomize, "overlays", "gateway-api"))
    text = text.replace("REGISTRY/kvroute:TAG", values["module"]["image"])
    text = text.replace("MANIFEST_DIGEST", values["module"]["sha256"])
    generated = docs(inferencepool(values, "-", "--service-name", "vllm", stdin=OVERLAY_AS_POOL))
    return same_objects(docs(text), generated, "overlays/gateway-api", "tools/inferencepool.py")


# What must fail, and the words helm's answer must hold: (label, extra helm args, words).
REFUSALS = [
    ("the unedited values.yaml", [],
     ["'REGISTRY/kvroute:TAG' does not match pattern", "'MANIFEST_DIGEST' does not match pattern",
      "/module/image", "/module/sha256"]),
    ("the example pools' placeholders", ["--set", "modelServers.layout=aggregated"],
     ["'vllm/vllm-openai:VLLM_VERSION' does not match pattern", "'MODEL_NAME' does not match pattern"]),
    ("an unknown key", ["-f", "{example}", "--set", "module.imgae=x"],
     ["additional properties 'imgae' not allowed"]),
    ("a misspelt kvroute configuration field", ["-f", "{example}", "--set", "config.poll_intervall_ms=100"],
     ["/config", "additional properties 'poll_intervall_ms' not allowed"]),
    ("a configuration without the pool Service's cluster",
     ["-f", "{example}", "--set", "pool.service=other.models.svc.cluster.local"],
     ["config.pools: no pool has cluster \"outbound|8000||other.models.svc.cluster.local\""]),
    ("an InferencePool with two target ports",
     ["-f", "{inference-pool}", "--set-json", 'inferencePool.targetPorts=[{"number":8000},{"number":8001}]'],
     ["/inferencePool/targetPorts", "maxItems"]),
    ("an InferencePool without a selector",
     ["-f", "{inference-pool}", "--set-json", 'inferencePool.selector={"matchLabels":{}}'],
     ["/inferencePool/selector/matchLabels", "minProperties"]),
    ("an InferencePool with the example model servers",
     ["-f", "{inference-pool}", "--set", "modelServers.layout=aggregated", "--set",
      "modelServers.image=vllm/vllm-openai:v0.11.0", "--set", "modelServers.model=m"],
     ["modelServers.layout must be none"]),
    ("the multi-node (lws) pools' placeholders", ["--set", "modelServers.layout=lws"],
     ["'vllm/vllm-openai:VLLM_VERSION' does not match pattern", "'MODEL_NAME' does not match pattern"]),
    ("an lws pool that is not the leaders' Service (workers do not serve the API)",
     ["-f", "{lws}", "--set", "pool.service=vllm.models.svc.cluster.local", "--set-json",
      'config.pools=[{"name":"vllm","cluster":"outbound|8000||vllm.models.svc.cluster.local"}]'],
     ["modelServers.layout lws writes vllm-leader.models port 8000"]),
    ("an lws group of one pod", ["-f", "{lws}", "--set", "modelServers.lws.size=1"],
     ["/modelServers/lws/size", "minimum"]),
    ("a misspelt lws key", ["-f", "{lws}", "--set", "modelServers.lws.sise=4"],
     ["/modelServers/lws", "additional properties 'sise' not allowed"]),
    ("your own Gateway's routes left unnamed (scoping needs their Envoy route names)",
     ["-f", "{inference-pool}", "--set-json", "gateway.modelRoutes=[]"],
     ["gateway.modelRoutes: with gateway.api gatewayRef"]),
]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--helm", default=os.path.join(ROOT, ".tools/helm/helm"))
    parser.add_argument("--chart", default=CHART)
    parser.add_argument("--kustomize", default=os.path.join(ROOT, "deploy/kustomize"))
    parser.add_argument("--schemas", default=os.path.join(ROOT, "deploy/schemas"))
    parser.add_argument("--out", help="also write each rendering to OUT/<example>.yaml")
    parser.add_argument("--sync", action="store_true", help="refresh the chart's copies first")
    args = parser.parse_args()
    if not os.path.exists(args.helm):
        sys.exit(f"{args.helm} missing: run `make helm`")

    failures = check_copies(args.sync)
    for line in failures:
        print(f"FAIL {line}")
    crds = check_manifests.crd_schemas(args.schemas)
    examples_dir = os.path.join(args.chart, "examples")
    examples = sorted(n for n in os.listdir(examples_dir) if n.endswith(".yaml"))
    if not examples:
        failures.append("no examples")
    for example in examples:
        name = example[: -len(".yaml")]
        path = os.path.join(examples_dir, example)
        label = f"helm/{name}"
        rc, out, err = helm(args.helm, "lint", "--strict", args.chart, "-f", path)
        if rc != 0:
            print(f"FAIL {label}: helm lint --strict:\n{out}{err}")
            failures.append(label)
            continue
        rc, out, err = helm(args.helm, "template", "kvroute", args.chart, "-f", path)
        if rc != 0:
            print(f"FAIL {label}: helm template:\n{err}")
            failures.append(label)
            continue
        errors = check_manifests.check_text(label, out, crds)
        failures += [label] * errors
        rendered = docs(out)
        with open(path) as f:
            values = yaml.safe_load(f)
        for line in check_monitoring(rendered, values):
            print(f"FAIL {label}: {line}")
            failures.append(line)
        if (values.get("inferencePool") or {}).get("name"):
            diffs = compare_with_generator(rendered, values, name)
            for line in diffs:
                print(f"FAIL {label}: {line}")
            failures += diffs
            if not diffs:
                print(f"ok   {label}: the objects tools/inferencepool.py writes for "
                      f"{os.path.relpath(INFERENCEPOOL_MANIFEST, ROOT)} (and its --helm-values)")
        elif os.path.isdir(os.path.join(args.kustomize, "overlays", name)):
            diffs, only_chart = compare_with_overlay(name, rendered, values, args.kustomize)
            for line in diffs:
                print(f"FAIL {label}: {line}")
            failures += diffs
            if not diffs:
                extra = f" (and, not in the overlay: {', '.join(only_chart)})" if only_chart else ""
                print(f"ok   {label}: the objects of overlays/{name}{extra}")
        else:
            print(f"FAIL {label}: no overlays/{name} to compare with")
            failures.append(label)
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, f"{name}.yaml"), "w") as f:
                f.write(out)

    with open(os.path.join(examples_dir, examples[0])) as f:
        diffs = check_generator_overlay(yaml.safe_load(f), args.kustomize)
    for line in diffs:
        print(f"FAIL tools/inferencepool.py: {line}")
    failures += diffs
    if not diffs:
        print("ok   tools/inferencepool.py: the gateway-api overlay's pool as an InferencePool gives "
              "that overlay's Service, HTTPRoute and EnvoyFilter")

    for what, extra, words in REFUSALS:
        extra = [a.replace("{example}", os.path.join(examples_dir, examples[0]))
                 .replace("{inference-pool}", os.path.join(examples_dir, "inference-pool.yaml"))
                 .replace("{lws}", os.path.join(examples_dir, "lws.yaml"))
                 for a in extra]
        rc, out, err = helm(args.helm, "template", "kvroute", args.chart, *extra)
        missing = [w for w in words if w not in err]
        if rc == 0 or missing:
            print(f"FAIL refused: {what}: exit {rc}, {missing} not in:\n{err}")
            failures.append(what)
        else:
            said = next(l.strip() for l in err.splitlines() if words[0] in l)
            print(f"ok   refused: {what}: {said}")
    print(f"{len(failures)} error(s)")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
