#!/usr/bin/env python3
"""Puts kvroute in front of a Gateway API Inference Extension InferencePool on Istio.

Reads the manifests a GIE user already has (YAML, multi-document, several files or `-`): the
`InferencePool` (inference.networking.k8s.io/v1), the `HTTPRoute`s whose backendRefs name it, their
`Gateway`, and the `InferenceObjective`s (inference.networking.x-k8s.io/v1alpha2) that point at it;
every other document is ignored. Writes what kvroute needs instead of the endpoint picker:

* a ClusterIP `Service` `<pool>-kvroute` in the pool's namespace with the pool's selector
  (spec.selector.matchLabels) and target port (spec.targetPorts, spec.appProtocol). Istio turns the
  InferencePool itself into a headless shadow Service, whose ORIGINAL_DST cluster has no members
  kvroute could read; this Service's cluster `outbound|PORT||<pool>-kvroute.NS.svc.cluster.local`
  has them (EDS), and kvroute reads them from the gateway's admin API;
* each such `HTTPRoute` with its InferencePool backendRefs pointing at that Service instead (the
  rest of the route kept as written);
* the `EnvoyFilter` `kvroute`: deploy/kustomize/base/envoyfilter.yaml as the gateway-api overlay
  attaches it (the Gateway's namespace, `targetRefs` to it, the patches on its listener's port),
  with the module, its digest and kvroute's configuration (deploy/kustomize/overlays/gateway-api's,
  or --config's) whose `pools` is the Service's cluster; an endpointPickerRef with `failureMode:
  FailOpen` sets `on_no_endpoint: passthrough` (no pod kvroute can pick: the cluster's balancer);
* with InferenceObjectives: the `EnvoyFilter` `kvroute-objectives`, a Lua filter just before
  kvroute that sets kvroute's priority header (`shedding.priority_header`, x-kvroute-priority) from
  the objective the request names in `x-gateway-inference-objective`, and removes any priority the
  client sent itself. A negative priority is shed (429) while every pod is saturated, as the EPP
  sheds it; other priorities are all served alike (kvroute has no flow-control queue).

    .tools/venv/bin/python tools/inferencepool.py pool.yaml httproute.yaml \\
        --image registry.example.com/ml/kvroute:0.1.0 --sha256 3edc… > kvroute-pool.yaml
    kubectl apply -f kvroute-pool.yaml
    kubectl get inferencepool,httproute -A -o yaml | tools/inferencepool.py - --image … --sha256 …

--helm-values writes the chart's values for the same pool instead (deploy/helm/kvroute,
`inferencePool` and `gateway`). PyYAML (tools/requirements.txt, `make tools`); exit status 2 with
one line naming what is missing or refused.
"""

import argparse
import copy
import json
import os
import re
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASE_ENVOYFILTER = os.path.join(ROOT, "deploy/kustomize/base/envoyfilter.yaml")
DEFAULT_SETTINGS = os.path.join(ROOT, "deploy/kustomize/overlays/gateway-api/settings.yaml")

POOL_GROUP = "inference.networking.k8s.io"
POOL_GROUPS = (POOL_GROUP, "inference.networking.x-k8s.io")   # the pre-v1 group, still in old routes
GATEWAY_GROUP = "gateway.networking.k8s.io"
OBJECTIVE_HEADER = "x-gateway-inference-objective"
PRIORITY_HEADER = "x-kvroute-priority"
# The chart's pattern for module.image (values.schema.json): refuses the REGISTRY/kvroute:TAG placeholder.
IMAGE = re.compile(r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?(:[0-9]+)?(/[a-z0-9]+([._-]+[a-z0-9]+)*)+"
                   r"(:[A-Za-z0-9_.-]*[a-z0-9.-][A-Za-z0-9_.-]*)?$")
DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
# Fields the API server writes, dropped from a route read back with `kubectl get -o yaml`.
SERVER_FIELDS = ("uid", "resourceVersion", "generation", "creationTimestamp", "managedFields",
                 "selfLink", "deletionTimestamp", "deletionGracePeriodSeconds", "ownerReferences")
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


class Dumper(yaml.SafeDumper):
    """Multi-line strings (kvroute's configuration, the Lua source) as literal blocks."""


Dumper.add_representer(str, lambda dumper, s: dumper.represent_scalar(
    "tag:yaml.org,2002:str", s, style="|" if "\n" in s else None))


class Refused(Exception):
    """What the input or the options lack, said in one line."""


def load_docs(paths):
    docs = []
    for path in paths:
        text = sys.stdin.read() if path == "-" else open(path).read()
        for doc in yaml.safe_load_all(text):
            if isinstance(doc, dict) and doc.get("kind", "").endswith("List") and "items" in doc:
                docs += [d for d in doc["items"] if isinstance(d, dict)]   # kubectl get -o yaml
            elif isinstance(doc, dict):
                docs.append(doc)
    return docs


def group_of(doc):
    return doc.get("apiVersion", "").rpartition("/")[0]


def name_of(doc):
    return (doc.get("metadata") or {}).get("name", "")


def namespace_of(doc, default):
    return (doc.get("metadata") or {}).get("namespace") or default


def select_pool(docs, name):
    pools = [d for d in docs if d.get("kind") == "InferencePool" and group_of(d) in POOL_GROUPS]
    if name:
        pools = [p for p in pools if name_of(p) == name]
    if not pools:
        raise Refused(f"no InferencePool{' named ' + name if name else ''} in the input")
    if len(pools) > 1:
        raise Refused("several InferencePools in the input ("
                      + ", ".join(name_of(p) for p in pools) + "): name one with --pool")
    pool = pools[0]
    if group_of(pool) != POOL_GROUP or pool.get("apiVersion") != f"{POOL_GROUP}/v1":
        raise Refused(f"InferencePool {name_of(pool)}: apiVersion {pool.get('apiVersion')}; "
                      f"only {POOL_GROUP}/v1 is read (spec.selector.matchLabels, spec.targetPorts)")
    return pool


def pool_port(pool, chosen):
    """The one target port kvroute routes to (kvroute's pool is one Envoy cluster, and Istio gives
    each Service port its own: a pod's second engine on another port would be another cluster, which
    the route cannot reach once it has picked the first)."""
    ports = [p.get("number") for p in (pool["spec"].get("targetPorts") or [])]
    if not ports or not all(isinstance(p, int) and 0 < p < 65536 for p in ports):
        raise Refused(f"InferencePool {name_of(pool)}: spec.targetPorts has no valid port number")
    if chosen is not None:
        if chosen not in ports:
            raise Refused(f"--port {chosen} is not one of spec.targetPorts {ports}")
        return chosen
    if len(ports) > 1:
        raise Refused(f"InferencePool {name_of(pool)}: spec.targetPorts {ports}: kvroute routes within "
                      "one port's pods (one Envoy cluster); pick it with --port (the others' engines "
                      "are then not used)")
    return ports[0]


def pool_selector(pool):
    selector = (pool["spec"].get("selector") or {}).get("matchLabels") or {}
    if not selector:
        raise Refused(f"InferencePool {name_of(pool)}: spec.selector.matchLabels is empty")
    return {str(k): str(v) for k, v in selector.items()}


def is_pool_ref(ref, pool, pool_ns, route_ns):
    return (ref.get("kind") == "InferencePool" and ref.get("group") in POOL_GROUPS
            and ref.get("name") == name_of(pool) and ref.get("namespace", route_ns) == pool_ns)


def clean_metadata(doc):
    meta = doc.setdefault("metadata", {})
    for field in SERVER_FIELDS:
        meta.pop(field, None)
    annotations = meta.get("annotations") or {}
    annotations.pop(LAST_APPLIED, None)
    if not annotations:
        meta.pop("annotations", None)
    doc.pop("status", None)


def rewrite_routes(docs, pool, pool_ns, service, port, default_ns):
    """The HTTPRoutes that name the pool, their pool backendRefs pointing at the Service; and the
    names Istio gives those rules' Envoy routes (the rule's `name`, else NAMESPACE.ROUTE.INDEX),
    the routes kvroute is scoped to."""
    routes, route_names = [], []
    for doc in docs:
        if doc.get("kind") != "HTTPRoute" or group_of(doc) != GATEWAY_GROUP:
            continue
        route_ns = namespace_of(doc, default_ns)
        route = copy.deepcopy(doc)
        hit = False
        for index, rule in enumerate((route.get("spec") or {}).get("rules") or []):
            rule_hit = False
            for ref in rule.get("backendRefs") or []:
                if is_pool_ref(ref, pool, pool_ns, route_ns):
                    for key in ("group", "kind", "name", "port"):
                        ref.pop(key, None)
                    ref.update({"name": service, "port": port})
                    rule_hit = True
            if rule_hit:
                route_names.append(rule.get("name") or f"{route_ns}.{name_of(route)}.{index}")
            hit = hit or rule_hit
        if hit:
            clean_metadata(route)
            route["metadata"]["namespace"] = route_ns
            routes.append(route)
    return routes, route_names


def parent_gateways(routes, default_ns):
    """(namespace, name, sectionName, port) of every Gateway the routes attach to."""
    parents = set()
    for route in routes:
        route_ns = route["metadata"]["namespace"]
        for ref in route["spec"].get("parentRefs") or []:
            if ref.get("kind", "Gateway") == "Gateway" and ref.get("group", GATEWAY_GROUP) == GATEWAY_GROUP:
                parents.add((ref.get("namespace", route_ns), ref["name"], ref.get("sectionName"),
                             ref.get("port")))
    return sorted(parents, key=str)


def listener_port(docs, gateway_ns, gateway, section, port, default_ns):
    """The Gateway listener's port, which Istio names its Envoy listener after (0.0.0.0_PORT)."""
    if port:
        return port
    found = [d for d in docs if d.get("kind") == "Gateway" and group_of(d) == GATEWAY_GROUP
             and name_of(d) == gateway and namespace_of(d, default_ns) == gateway_ns]
    if not found:
        return None
    listeners = [l for l in found[0].get("spec", {}).get("listeners") or []
                 if l.get("protocol") in ("HTTP", "HTTPS") and (not section or l.get("name") == section)]
    ports = sorted({l["port"] for l in listeners})
    if len(ports) != 1:
        raise Refused(f"Gateway {gateway_ns}/{gateway}: HTTP listener ports {ports}; name the one the "
                      "route uses (the parentRef's sectionName, or --listener-port)")
    return ports[0]


def objective_priorities(docs, pool, pool_ns, default_ns):
    """{objective name: priority} of the InferenceObjectives on this pool (unset: 0, as the EPP)."""
    priorities = {}
    for doc in docs:
        if doc.get("kind") != "InferenceObjective" or group_of(doc) != "inference.networking.x-k8s.io":
            continue
        ref = (doc.get("spec") or {}).get("poolRef") or {}
        if (ref.get("name") != name_of(pool) or ref.get("group", POOL_GROUP) != POOL_GROUP
                or namespace_of(doc, default_ns) != pool_ns):
            continue
        priority = doc["spec"].get("priority")
        priority = 0 if priority is None else priority
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise Refused(f"InferenceObjective {name_of(doc)}: spec.priority {priority!r} is not an integer")
        priorities[name_of(doc)] = priority
    return priorities


def lua_source(priorities, header):
    """The Lua filter that turns the request's objective into kvroute's priority header."""
    table = ", ".join(f"[{json.dumps(name)}] = {json.dumps(str(p))}" for name, p in sorted(priorities.items()))
    return (
        "-- kvroute's priority header from the InferenceObjective the request names.\n"
        f"local priorities = {{{table}}}\n"
        "function envoy_on_request(handle)\n"
        "  local headers = handle:headers()\n"
        f"  headers:remove({json.dumps(header)})\n"
        f'  local objective = headers:get("{OBJECTIVE_HEADER}")\n'
        "  local priority = objective and priorities[objective]\n"
        "  if priority then\n"
        f"    headers:add({json.dumps(header)}, priority)\n"
        "  end\n"
        "end\n")


def kvroute_config(base, pool, cluster, failure_mode):
    config = copy.deepcopy(base)
    config["pools"] = [{"name": name_of(pool), "cluster": cluster}]
    config.setdefault("admin_cluster", "kvroute_admin")
    if failure_mode == "FailOpen":
        config.setdefault("on_no_endpoint", "passthrough")
    return config


def default_config():
    with open(DEFAULT_SETTINGS) as f:
        return json.loads(yaml.safe_load(f)["data"]["kvroute.json"])


def read_config(path):
    with open(path) as f:
        config = yaml.safe_load(f)   # JSON is YAML
    if not isinstance(config, dict):
        raise Refused(f"--config {path}: not a JSON or YAML object")
    return config


def envoyfilter(image, sha256, config, service_host, port, gateway_ns, gateway, listener, route_names):
    """base/envoyfilter.yaml with kvroute-settings' values and the gateway-api overlay's attachment,
    scoped to the pool's routes (one HTTP_ROUTE patch each); with none known (--gateway and no
    HTTPRoute given), kvroute runs on the whole listener, as the chart's gateway.scoped false."""
    with open(BASE_ENVOYFILTER) as f:
        ef = yaml.safe_load(f)
    ef["metadata"]["namespace"] = gateway_ns
    ef["spec"] = spec = {"targetRefs": [{"group": GATEWAY_GROUP, "kind": "Gateway", "name": gateway}],
                         **{k: v for k, v in ef["spec"].items() if k != "workloadSelector"}}
    for patch in spec["configPatches"]:
        value, match = patch["patch"]["value"], patch.get("match") or {}
        if patch["applyTo"] == "EXTENSION_CONFIG":
            wasm = value["typed_config"]["config"]
            wasm["vm_config"]["code"]["remote"]["http_uri"]["uri"] = f"oci://{image}"
            wasm["vm_config"]["code"]["remote"]["sha256"] = sha256
            wasm["configuration"]["value"] = json.dumps(config, indent=2) + "\n"
        if "listener" in match:
            match["listener"]["portNumber"] = listener
        if patch["applyTo"] == "CLUSTER" and "cluster" in match:
            match["cluster"]["service"] = service_host
            match["cluster"]["portNumber"] = port
        if patch["applyTo"] == "HTTP_FILTER" and not route_names:
            value.pop("disabled", None)
    scoped = []
    for patch in spec["configPatches"]:
        if patch["applyTo"] != "HTTP_ROUTE":
            scoped.append(patch)
            continue
        for name in route_names:
            one = copy.deepcopy(patch)
            one["match"]["routeConfiguration"]["vhost"]["route"]["name"] = name
            scoped.append(one)
    spec["configPatches"] = scoped
    return ef


def objectives_envoyfilter(priorities, header, gateway_ns, gateway, listener):
    return {
        "apiVersion": "networking.istio.io/v1alpha3",
        "kind": "EnvoyFilter",
        "metadata": {"name": "kvroute-objectives", "namespace": gateway_ns},
        "spec": {
            "targetRefs": [{"group": GATEWAY_GROUP, "kind": "Gateway", "name": gateway}],
            # Applied after the EnvoyFilter kvroute (priority 0), whose filter this one precedes.
            "priority": 10,
            "configPatches": [{
                "applyTo": "HTTP_FILTER",
                "match": {"context": "GATEWAY", "listener": {
                    "portNumber": listener,
                    "filterChain": {"filter": {"name": "envoy.filters.network.http_connection_manager",
                                               "subFilter": {"name": "kvroute"}}}}},
                "patch": {"operation": "INSERT_BEFORE", "value": {
                    "name": "kvroute.objectives",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua",
                        "default_source_code": {"inline_string": lua_source(priorities, header)}}}},
            }],
        },
    }


def service(pool, name, namespace, port):
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {   # ClusterIP, the default: not the headless form Istio gives the InferencePool
            "selector": pool_selector(pool),
            "ports": [{"name": "http", "port": port, "targetPort": port,
                       "appProtocol": pool["spec"].get("appProtocol", "http")}],
        },
    }


def generate(args):
    docs = load_docs(args.files)
    pool = select_pool(docs, args.pool)
    pool_ns = namespace_of(pool, args.namespace)
    port = pool_port(pool, args.port)
    svc = args.service_name or f"{name_of(pool)}-kvroute"
    if not DNS_LABEL.match(svc):
        raise Refused(f"Service name {svc!r} is not a DNS label of at most 63 characters: set --service-name")
    host = f"{svc}.{pool_ns}.svc.{args.cluster_domain}"
    routes, route_names = rewrite_routes(docs, pool, pool_ns, svc, port, args.namespace)

    if args.gateway:
        gw_ns, _, gw = args.gateway.rpartition("/")
        gateways = [(gw_ns or pool_ns, gw, None, None)]
    else:
        gateways = parent_gateways(routes, args.namespace)
        if not routes:
            raise Refused(f"no HTTPRoute in the input has a backendRef to InferencePool {pool_ns}/"
                          f"{name_of(pool)}: give the route, or the Gateway with --gateway [NS/]NAME")
        if len({g[:2] for g in gateways}) != 1:
            raise Refused("the routes attach to " + (", ".join(f"{g[0]}/{g[1]}" for g in gateways) or "no Gateway")
                          + ": kvroute's EnvoyFilter goes on one; name it with --gateway [NS/]NAME")
    gw_ns, gw = gateways[0][:2]
    listener = args.listener_port or listener_port(docs, gw_ns, gw, gateways[0][2], gateways[0][3],
                                                   args.namespace)
    if not listener:
        raise Refused(f"the port of Gateway {gw_ns}/{gw}'s listener is unknown: give the Gateway in the "
                      "input or --listener-port (Istio's listener is named after it; a patch that "
                      "matches no listener is skipped silently)")

    failure_mode = (pool["spec"].get("endpointPickerRef") or {}).get("failureMode", "FailClose")
    priorities = objective_priorities(docs, pool, pool_ns, args.namespace)
    cluster = f"outbound|{port}||{host}"
    config = kvroute_config(read_config(args.config) if args.config else default_config(),
                            pool, cluster, failure_mode)
    if args.helm_values:
        return [helm_values(args, pool, pool_ns, port, failure_mode, priorities, gw_ns, gw, listener,
                            route_names)]
    out = [service(pool, svc, pool_ns, port)]
    out += routes
    out.append(envoyfilter(args.image, args.sha256, config, host, port, gw_ns, gw, listener,
                           route_names))
    if priorities:
        header = (config.get("shedding") or {}).get("priority_header", PRIORITY_HEADER)
        if not header:
            raise Refused("InferenceObjectives' priorities need kvroute's shedding.priority_header, "
                          "which the configuration turns off")
        out.append(objectives_envoyfilter(priorities, header, gw_ns, gw, listener))
    return out


def helm_values(args, pool, pool_ns, port, failure_mode, priorities, gw_ns, gw, listener, route_names):
    """The chart's values for the same objects (templates/inference-pool.yaml and the EnvoyFilter
    attached to the Gateway by targetRefs: gateway.api gatewayRef)."""
    ip = {"name": name_of(pool), "namespace": pool_ns}
    if args.service_name:
        ip["serviceName"] = args.service_name
    ip.update({
        "selector": {"matchLabels": pool_selector(pool)},
        "targetPorts": [{"number": port}],
        "appProtocol": pool["spec"].get("appProtocol", "http"),
        "failureMode": failure_mode,
        "objectives": priorities,
        "clusterDomain": args.cluster_domain,
    })
    values = {
        "module": {"image": args.image, "sha256": args.sha256},
        "gateway": {"api": "gatewayRef", "namespace": gw_ns, "name": gw, "port": listener,
                    **({"modelRoutes": route_names} if route_names else {"scoped": False})},
        "inferencePool": ip,
    }
    if args.config:
        values["config"] = {k: v for k, v in read_config(args.config).items() if k != "pools"}
    return values

def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("files", nargs="+", help="YAML manifests (`-`: standard input)")
    parser.add_argument("--image", required=True,
                        help="the module's OCI image, where `make push` put it (without oci://)")
    parser.add_argument("--sha256", required=True, help="its manifest digest, 64 hex digits")
    parser.add_argument("--pool", help="the InferencePool's name, when the input holds several")
    parser.add_argument("-n", "--namespace", default="default",
                        help="the namespace of documents that name none (kubectl apply -n; default: default)")
    parser.add_argument("--port", type=int, help="the target port to route to, when the pool has several")
    parser.add_argument("--service-name", help="the Service kvroute routes in (default: <pool>-kvroute)")
    parser.add_argument("--gateway", help="[NS/]NAME: the Gateway whose proxy runs kvroute (default: "
                        "the routes' parentRef)")
    parser.add_argument("--listener-port", type=int,
                        help="that Gateway's listener port (default: read from the Gateway in the input)")
    parser.add_argument("--config", help="kvroute's configuration (JSON or YAML) to start from; its pools "
                        "are replaced (default: deploy/kustomize/overlays/gateway-api's)")
    parser.add_argument("--cluster-domain", default="cluster.local")
    parser.add_argument("--helm-values", action="store_true",
                        help="write values for deploy/helm/kvroute (inferencePool, gateway) instead")
    parser.add_argument("--out", help="write here instead of standard output")
    args = parser.parse_args()
    if not IMAGE.match(args.image):
        parser.exit(2, f"--image {args.image!r}: not an image reference (HOST[:PORT]/PATH[:TAG], "
                       "lower case, without oci://)\n")
    if not re.fullmatch(r"[0-9a-f]{64}", args.sha256):
        parser.exit(2, f"--sha256 {args.sha256!r}: not 64 lower-case hex digits (the manifest digest "
                       "`make push` printed, without sha256:)\n")
    try:
        docs = generate(args)
    except Refused as e:
        parser.exit(2, f"inferencepool: {e}\n")
    except (OSError, yaml.YAMLError) as e:
        parser.exit(2, f"inferencepool: {e}\n")
    header = ("# Generated by tools/inferencepool.py from " + ", ".join(args.files)
              + " (deploy/README.md, \"From an InferencePool\").\n")
    text = header + yaml.dump_all(docs, Dumper=Dumper, sort_keys=False, width=100)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
