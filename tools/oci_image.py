#!/usr/bin/env python3
"""Builds the kvroute Wasm module into an OCI image layout, without Docker.

The image is Istio's "compat" form of a Wasm image: one `application/vnd.oci.image.layer.v1.tar+gzip`
layer whose tar holds `plugin.wasm`, a config blob, the manifest, and `index.json` + `oci-layout`.
Istio's `sha256` field (WasmPlugin, or `remote.sha256` in an EnvoyFilter) is the digest of the image
manifest, not of the .wasm file: this prints it.

Deterministic: the same plugin.wasm gives the same bytes and digests (with the same Python and zlib):
a tar member with mtime 0, uid/gid 0, mode 0644 and no user names; gzip without a timestamp or file
name; JSON with sorted keys; no creation dates.

    python3 tools/oci_image.py --wasm target/wasm32-wasip1/release/kvroute.wasm --out dist/oci/kvroute
    skopeo copy oci:dist/oci/kvroute docker://REGISTRY/kvroute:TAG

Python 3 standard library only.
"""

import argparse
import gzip
import hashlib
import io
import json
import os
import shutil
import sys
import tarfile

LAYER_MEDIA_TYPE = "application/vnd.oci.image.layer.v1.tar+gzip"
CONFIG_MEDIA_TYPE = "application/vnd.oci.image.config.v1+json"
MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
INDEX_MEDIA_TYPE = "application/vnd.oci.image.index.v1+json"
# The file name Istio's image fetcher looks for in the layer (compat variant).
MEMBER = "plugin.wasm"
# The manifest annotations `make oci` sets from Cargo.toml and git (the OCI image-spec names).
ANNOTATED = ("source", "version", "revision", "licenses")


def canonical_json(value):
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def sha256(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


def layer_tar(wasm):
    """An uncompressed tar with one regular file, `plugin.wasm`, and fixed metadata."""
    buf = io.BytesIO()
    info = tarfile.TarInfo(MEMBER)
    info.size = len(wasm)
    info.mtime = 0
    info.mode = 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.type = tarfile.REGTYPE
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        tar.addfile(info, io.BytesIO(wasm))
    return buf.getvalue()


def gzip_bytes(data):
    """gzip with mtime 0 and no file name in the header (gzip.compress writes none)."""
    return gzip.compress(data, compresslevel=9, mtime=0)


def build(wasm, tag, labels=None):
    """Returns {digest: bytes} for every blob, the manifest descriptor and the index. `labels`:
    more `org.opencontainers.image.*` manifest annotations (source, version, revision, licenses),
    which registries and scanners show for the image."""
    tar = layer_tar(wasm)
    layer = gzip_bytes(tar)
    config = canonical_json(
        {
            "architecture": "wasm",
            "os": "wasip1",
            "config": {},
            "rootfs": {"type": "layers", "diff_ids": [sha256(tar)]},
        }
    )
    manifest = canonical_json(
        {
            "schemaVersion": 2,
            "mediaType": MANIFEST_MEDIA_TYPE,
            "config": {"mediaType": CONFIG_MEDIA_TYPE, "digest": sha256(config), "size": len(config)},
            "layers": [{"mediaType": LAYER_MEDIA_TYPE, "digest": sha256(layer), "size": len(layer)}],
            "annotations": {"org.opencontainers.image.title": MEMBER, **(labels or {})},
        }
    )
    descriptor = {
        "mediaType": MANIFEST_MEDIA_TYPE,
        "digest": sha256(manifest),
        "size": len(manifest),
        "annotations": {"org.opencontainers.image.ref.name": tag},
    }
    index = canonical_json({"schemaVersion": 2, "mediaType": INDEX_MEDIA_TYPE, "manifests": [descriptor]})
    blobs = {sha256(b): b for b in (layer, config, manifest)}
    return blobs, descriptor, index


def write_layout(out, blobs, index):
    """Writes the layout next to `out` and swaps it in, so a failed run leaves the old one intact."""
    out = os.path.normpath(out)
    if os.path.exists(out) and not os.path.exists(os.path.join(out, "oci-layout")):
        if os.listdir(out):
            sys.exit(f"{out} exists and is not an OCI layout; not overwriting it")
    tmp = out + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(os.path.join(tmp, "blobs", "sha256"))
    for digest in sorted(blobs):
        with open(os.path.join(tmp, "blobs", "sha256", digest.split(":", 1)[1]), "wb") as f:
            f.write(blobs[digest])
    with open(os.path.join(tmp, "oci-layout"), "wb") as f:
        f.write(canonical_json({"imageLayoutVersion": "1.0.0"}))
    with open(os.path.join(tmp, "index.json"), "wb") as f:
        f.write(index)
    shutil.rmtree(out, ignore_errors=True)
    os.rename(tmp, out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wasm", required=True, help="the built plugin (kvroute.wasm)")
    parser.add_argument("--out", required=True, help="OCI layout directory to (re)create")
    parser.add_argument("--tag", default="latest", help="org.opencontainers.image.ref.name in index.json")
    for name in ANNOTATED:
        parser.add_argument(f"--{name}", help=f"org.opencontainers.image.{name} (omitted when empty)")
    args = parser.parse_args()
    labels = {f"org.opencontainers.image.{n}": getattr(args, n) for n in ANNOTATED if getattr(args, n)}
    with open(args.wasm, "rb") as f:
        wasm = f.read()
    if wasm[:4] != b"\0asm":
        sys.exit(f"{args.wasm} is not a Wasm module")
    blobs, descriptor, index = build(wasm, args.tag, labels)
    write_layout(args.out, blobs, index)
    digest = descriptor["digest"]
    total = sum(len(b) for b in blobs.values())
    print(f"OCI layout: {args.out} (tag {args.tag}; plugin.wasm {len(wasm)} bytes; {len(blobs)} blobs, {total} bytes)")
    print(f"manifest digest: {digest}")
    print(f"Istio sha256:    {digest.split(':', 1)[1]}")


if __name__ == "__main__":
    main()
