#!/usr/bin/env python3
"""Refuses rendered manifests that still hold the overlays' placeholders, naming each: the document,
the field and the value to set. Applied unedited, `REGISTRY/kvroute:TAG` makes istio-agent's module
fetch fail (the gateway's listener stays unready or answers 403), `VLLM_VERSION` and `MODEL_NAME`
give model-server pods that cannot start, `PROMETHEUS_URL` KEDA triggers that never scale.

    .tools/venv/bin/python tools/check_placeholders.py dist/manifests/*.yaml   # make manifests
    kubectl kustomize my-overlay | .tools/venv/bin/python tools/check_placeholders.py -

Exit status 1 when any placeholder is left, one line per field. (The Helm chart refuses the same
placeholders in its values schema: `make helm-check`.)
"""

import sys

import yaml

# Each placeholder of deploy/kustomize and where its value is set.
PLACEHOLDERS = {
    "REGISTRY/kvroute:TAG": "`image` in the overlay's settings.yaml: the image `make push` printed",
    "MANIFEST_DIGEST": "`sha256` in the overlay's settings.yaml: the manifest digest `make push` printed (hex)",
    "VLLM_VERSION": "the model servers' image tag: the vLLM release you run (components/vllm-pool or vllm-pd-pools)",
    "MODEL_NAME": "the model servers' --model: e.g. a Hugging Face model id (components/vllm-pool or vllm-pd-pools)",
    "PROMETHEUS_URL": "the KEDA triggers' serverAddress: your Prometheus (components/autoscaling-keda)",
}


def strings(node, path):
    """(path, string) of every string in a document, paths as kubectl prints them."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield from strings(v, f"{path}.{k}" if path else str(k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from strings(v, f"{path}[{i}]")
    elif isinstance(node, str):
        yield path, node


def placeholders_in(text, source):
    """One line per field holding a placeholder."""
    found = []
    for doc in yaml.safe_load_all(text):
        if not isinstance(doc, dict):
            continue
        meta = doc.get("metadata") or {}
        what = f"{source}: {doc.get('kind')} {meta.get('namespace', '')}/{meta.get('name', '')}"
        for path, value in strings(doc, ""):
            for placeholder, how in PLACEHOLDERS.items():
                if placeholder in value:
                    found.append(f"{what} {path}: placeholder {placeholder} left in place: set {how}")
    return found


def main(argv):
    if not argv:
        print(__doc__.strip().splitlines()[0], file=sys.stderr)
        return 2
    failures = []
    for name in argv:
        if name == "-":
            failures += placeholders_in(sys.stdin.read(), "stdin")
        else:
            with open(name) as f:
                failures += placeholders_in(f.read(), name)
    for line in failures:
        print(line)
    if not failures:
        print(f"ok   no placeholder left in {', '.join(argv)}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
