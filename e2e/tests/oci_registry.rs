//! The module through a real OCI registry, as a platform team ships it: Debian's `docker-registry`
//! (the CNCF distribution registry) on a free loopback port; `make push` copies both images of
//! `make oci` there with skopeo; then the image is fetched back the way Istio's agent fetches it
//! (its Accept headers, the manifest digest it checks against `sha256`, the last layer, which must
//! be `tar+gzip`, and the member `plugin.wasm`), and with `skopeo copy` into a new layout.
//!
//! Skips, saying so, where `docker-registry` or `skopeo` is not installed (`make sysdeps`).

use flate2::read::GzDecoder;
use harness::{free_port, lite_wasm_path, on_path, repo_root, wasm_path};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// What Istio's image fetcher (go-containerregistry's remote.Image) asks a registry for.
const ISTIO_ACCEPT: &str = "application/vnd.oci.image.manifest.v1+json, \
    application/vnd.docker.distribution.manifest.v2+json, \
    application/vnd.oci.image.index.v1+json, \
    application/vnd.docker.distribution.manifest.list.v2+json";
const WASM_LAYER: &str = "application/vnd.oci.image.layer.v1.tar+gzip";

/// The registry process, killed by PID when dropped (also when the test fails).
struct Registry {
    child: Child,
    addr: String,
    dir: PathBuf,
}

impl Registry {
    fn start(bin: &Path) -> Registry {
        let port = free_port().unwrap();
        let dir =
            std::env::temp_dir().join(format!("kvroute-registry-{}-{port}", std::process::id()));
        std::fs::create_dir_all(dir.join("storage")).unwrap();
        let addr = format!("127.0.0.1:{port}");
        let config = format!(
            "version: 0.1\nlog: {{level: warn}}\nstorage:\n  filesystem: {{rootdirectory: {}}}\n  \
             delete: {{enabled: true}}\nhttp:\n  addr: {addr}\n",
            dir.join("storage").display()
        );
        std::fs::write(dir.join("config.yml"), config).unwrap();
        let child = Command::new(bin)
            .arg("serve")
            .arg(dir.join("config.yml"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(
                std::fs::File::create(dir.join("registry.log")).unwrap(),
            ))
            .spawn()
            .expect("docker-registry");
        Registry { child, addr, dir }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("registry.log")).unwrap_or_default()
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The manifest digest `tools/oci_image.py` wrote into a layout's index.
fn layout_digest(layout: &Path) -> String {
    let index: Value =
        serde_json::from_slice(&std::fs::read(layout.join("index.json")).unwrap()).unwrap();
    index["manifests"][0]["digest"]
        .as_str()
        .unwrap()
        .to_string()
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.stdin(Stdio::null()).output().expect("spawn");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{cmd:?} failed:\n{text}");
    text
}

/// The image fetched the way istio-agent fetches it; returns `plugin.wasm`.
async fn fetch_like_istio(
    client: &reqwest::Client,
    registry: &str,
    image: &str,
    tag: &str,
    want_digest: &str,
) -> Vec<u8> {
    let url = format!("http://{registry}/v2/{image}/manifests/{tag}");
    let resp = client
        .get(&url)
        .header("accept", ISTIO_ACCEPT)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "{url}");
    let served = resp
        .headers()
        .get("docker-content-digest")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let content_type = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let body = resp.bytes().await.unwrap();
    // Istio compares the manifest's digest with `sha256`: the bytes served must hash to it.
    assert_eq!(
        format!("sha256:{}", sha256_hex(&body)),
        want_digest,
        "{image}:{tag}: served manifest"
    );
    assert_eq!(
        served.as_deref(),
        Some(want_digest),
        "Docker-Content-Digest"
    );
    assert_eq!(
        content_type.as_deref(),
        Some("application/vnd.oci.image.manifest.v1+json")
    );
    let manifest: Value = serde_json::from_slice(&body).unwrap();
    // By digest too, as the agent re-fetches a pinned image.
    let by_digest = client
        .get(format!(
            "http://{registry}/v2/{image}/manifests/{want_digest}"
        ))
        .header("accept", ISTIO_ACCEPT)
        .send()
        .await
        .unwrap();
    assert_eq!(by_digest.status(), 200);
    assert_eq!(by_digest.bytes().await.unwrap(), body);

    let layers = manifest["layers"].as_array().expect("layers");
    let last = layers.last().expect("a layer");
    assert_eq!(
        last["mediaType"], WASM_LAYER,
        "Istio takes the last layer, of this type"
    );
    let digest = last["digest"].as_str().unwrap();
    let blob = client
        .get(format!("http://{registry}/v2/{image}/blobs/{digest}"))
        .send()
        .await
        .unwrap();
    assert_eq!(blob.status(), 200);
    let blob = blob.bytes().await.unwrap();
    assert_eq!(format!("sha256:{}", sha256_hex(&blob)), digest);
    let mut tar_bytes = Vec::new();
    GzDecoder::new(blob.as_ref())
        .read_to_end(&mut tar_bytes)
        .unwrap();
    let mut archive = tar::Archive::new(tar_bytes.as_slice());
    for entry in archive.entries().unwrap() {
        let mut entry = entry.unwrap();
        let name = entry
            .path()
            .unwrap()
            .file_name()
            .map(|n| n.to_string_lossy().into_owned());
        if name.as_deref() == Some("plugin.wasm") {
            let mut wasm = Vec::new();
            entry.read_to_end(&mut wasm).unwrap();
            return wasm;
        }
    }
    panic!("{image}:{tag}: no plugin.wasm in the layer");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn make_push_to_a_real_registry_and_fetch_back_as_istio_does() {
    let (Some(registry_bin), Some(_)) = (on_path("docker-registry"), on_path("skopeo")) else {
        eprintln!(
            "SKIP make_push_to_a_real_registry_and_fetch_back_as_istio_does: docker-registry or \
             skopeo is not installed (Debian packages docker-registry, skopeo: `make sysdeps`)"
        );
        return;
    };
    let wasm = std::fs::read(wasm_path().unwrap()).unwrap();
    let lite = std::fs::read(lite_wasm_path().unwrap()).unwrap();
    let registry = Registry::start(&registry_bin);
    let client = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(r) = client
            .get(format!("http://{}/v2/", registry.addr))
            .send()
            .await
        {
            if r.status() == 200 {
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "registry not up:\n{}",
            registry.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // `make push` as a user runs it (the images come from `make oci` into a scratch directory).
    let out_dir = registry.dir.join("oci");
    let (full_dir, lite_dir) = (out_dir.join("kvroute"), out_dir.join("kvroute-lite"));
    let pushed = run(Command::new("make")
        .current_dir(repo_root())
        .arg("--no-print-directory")
        .arg("push")
        .arg(format!("REGISTRY={}", registry.addr))
        .arg("TAG=t1")
        .arg("TLS_VERIFY=false")
        .arg(format!("OCI_DIR={}", full_dir.display()))
        .arg(format!("OCI_LITE_DIR={}", lite_dir.display())));
    let full_digest = layout_digest(&full_dir);
    let lite_digest = layout_digest(&lite_dir);
    assert_ne!(full_digest, lite_digest, "two images");
    for (image, digest) in [("kvroute", &full_digest), ("kvroute-lite", &lite_digest)] {
        let line = format!("pushed {}/{image}:t1 {digest}", registry.addr);
        assert!(
            pushed.lines().any(|l| l == line),
            "{line} not in:\n{pushed}"
        );
        assert!(
            pushed.contains(&format!("manifest digest: {digest}")),
            "make oci printed the digest Istio wants: {pushed}"
        );
    }

    // Fetched as Istio does: same digest, the built modules byte for byte.
    let got = fetch_like_istio(&client, &registry.addr, "kvroute", "t1", &full_digest).await;
    assert!(
        got == wasm,
        "kvroute:t1 plugin.wasm is the built kvroute.wasm"
    );
    let got = fetch_like_istio(&client, &registry.addr, "kvroute-lite", "t1", &lite_digest).await;
    assert!(
        got == lite,
        "kvroute-lite:t1 plugin.wasm is the built kvroute-lite.wasm"
    );

    // Pulled back with skopeo into a fresh layout: the same manifest digest.
    let pulled = registry.dir.join("pulled");
    run(Command::new("skopeo")
        .args([
            "copy",
            "--quiet",
            "--preserve-digests",
            "--src-tls-verify=false",
        ])
        .arg(format!("docker://{}/kvroute:t1", registry.addr))
        .arg(format!("oci:{}", pulled.display())));
    assert_eq!(layout_digest(&pulled), full_digest);
    let inspect = run(Command::new("skopeo")
        .args(["inspect", "--tls-verify=false", "--format", "{{.Digest}}"])
        .arg(format!("docker://{}/kvroute:t1", registry.addr)));
    assert_eq!(inspect.trim(), full_digest);

    // The manifest says what it is: the version (Cargo's plus the commit), the commit, the licence.
    let head = run(Command::new("git")
        .current_dir(repo_root())
        .args(["rev-parse", "HEAD"]))
    .trim()
    .to_owned();
    let short =
        run(Command::new("git")
            .current_dir(repo_root())
            .args(["rev-parse", "--short", "HEAD"]))
        .trim()
        .to_owned();
    let manifest_blob = full_dir
        .join("blobs/sha256")
        .join(full_digest.trim_start_matches("sha256:"));
    let manifest: Value = serde_json::from_slice(&std::fs::read(manifest_blob).unwrap()).unwrap();
    let labels = &manifest["annotations"];
    let version = labels["org.opencontainers.image.version"].as_str().unwrap();
    assert!(
        version.starts_with(&format!("{}-{short}", env!("CARGO_PKG_VERSION"))),
        "{labels}"
    );
    assert!(
        labels["org.opencontainers.image.revision"]
            .as_str()
            .unwrap()
            .starts_with(&head),
        "{labels}"
    );
    assert_eq!(labels["org.opencontainers.image.licenses"], "Apache-2.0");

    // The same bytes again under the same tag: accepted. Other bytes (here another source
    // annotation, so another manifest): refused, naming the tag and both digests, and the
    // registry still serves the first image.
    let push_again = |source: &str| {
        Command::new("make")
            .current_dir(repo_root())
            .arg("--no-print-directory")
            .arg("push")
            .arg(format!("REGISTRY={}", registry.addr))
            .arg("TAG=t1")
            .arg("TLS_VERIFY=false")
            .arg(format!("OCI_SOURCE={source}"))
            .arg(format!("OCI_DIR={}", full_dir.display()))
            .arg(format!("OCI_LITE_DIR={}", lite_dir.display()))
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let original_source = labels["org.opencontainers.image.source"]
        .as_str()
        .unwrap_or("")
        .to_owned();
    let same = push_again(&original_source);
    assert!(
        same.status.success(),
        "{}",
        String::from_utf8_lossy(&same.stderr)
    );
    let other = push_again("https://example.invalid/another-kvroute");
    let err = String::from_utf8_lossy(&other.stderr);
    assert!(!other.status.success(), "a tag was overwritten:\n{err}");
    assert!(
        err.contains(&format!(
            "{}/kvroute:t1 exists with digest {full_digest}",
            registry.addr
        )) && err.contains("refusing to overwrite"),
        "{err}"
    );
    let inspect = run(Command::new("skopeo")
        .args(["inspect", "--tls-verify=false", "--format", "{{.Digest}}"])
        .arg(format!("docker://{}/kvroute:t1", registry.addr)));
    assert_eq!(inspect.trim(), full_digest);

    // Without REGISTRY, `make push` says what it needs.
    let out = Command::new("make")
        .current_dir(repo_root())
        .args(["--no-print-directory", "push", "REGISTRY="])
        .arg(format!("OCI_DIR={}", full_dir.display()))
        .arg(format!("OCI_LITE_DIR={}", lite_dir.display()))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("make push needs REGISTRY="));
}
