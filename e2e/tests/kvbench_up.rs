//! `make up` as a newcomer meets it: the curl line it prints, sent twice, shows a prefix hit on the
//! second answer; its errors name the make variables the user typed.

mod common;

use harness::{repo_root, sibling_bin};
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// `kvbench up`, stopped with SIGTERM (its own clean shutdown stops Envoy and the pods) when
/// dropped, also when the test fails.
struct Up {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Up {
    fn start(args: &[&str]) -> Up {
        let mut child = Command::new(sibling_bin("kvbench"))
            .arg("up")
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("kvbench");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Up { child, lines }
    }

    /// stdout up to and including the line containing `until`.
    fn read_until(&self, until: &str) -> Vec<String> {
        let mut seen = Vec::new();
        loop {
            match self.lines.recv_timeout(Duration::from_secs(90)) {
                Ok(line) => {
                    let done = line.contains(until);
                    seen.push(line);
                    if done {
                        return seen;
                    }
                }
                Err(e) => panic!("no {until:?} from kvbench up ({e}); so far: {seen:#?}"),
            }
        }
    }

    fn terminate(&mut self) -> Option<std::process::ExitStatus> {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        for _ in 0..300 {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        None
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.terminate();
        }
    }
}

/// The URL and JSON body of a printed `curl -si URL -H … -d '{…}'` line.
fn parse_curl(line: &str) -> (String, Value) {
    let rest = line.split("curl -si ").nth(1).expect("curl -si");
    let url = rest.split_whitespace().next().unwrap().to_string();
    let body = rest
        .split(" -d '")
        .nth(1)
        .and_then(|b| b.strip_suffix('\''))
        .unwrap_or_else(|| panic!("no -d '…' in {line}"));
    (url, serde_json::from_str(body).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_printed_curl_line_shows_a_prefix_hit_when_repeated() {
    let mut up = Up::start(&["--port", "0", "--time-scale", common::TIME_SCALE]);
    let printed = up.read_until("Ctrl-C to stop");
    let curl = printed
        .iter()
        .find(|l| l.trim_start().starts_with("curl -si"))
        .unwrap_or_else(|| panic!("no curl line: {printed:#?}"));
    let (url, body) = parse_curl(curl);
    assert!(
        printed.iter().any(|l| l.contains("reason=prefix")),
        "the hint says what to look for: {printed:#?}"
    );

    let client = common::fresh_client();
    let send = || common::post(&client, &url, &body, &[]);
    let first = send().await;
    assert_eq!(first.status, 200, "{}", first.body);
    // A person retyping the command takes longer than the leader's 200 ms publishing tick.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let second = send().await;
    assert_eq!(second.status, 200, "{}", second.body);
    assert_eq!(
        second.debug_field("reason").as_deref(),
        Some("prefix"),
        "{:?}",
        second.debug
    );
    assert_eq!(second.debug_field("pod"), first.debug_field("pod"));
    // matched_blocks=N/M: several of the prompt's blocks were found on that pod.
    let matched: u64 = second
        .debug_field("matched_blocks")
        .and_then(|m| m.split('/').next()?.parse().ok())
        .unwrap_or(0);
    assert!(matched >= 4, "{:?}", second.debug);

    let status = up.terminate().expect("kvbench up stops on SIGTERM");
    assert!(status.success(), "{status}");
}

fn up_error(args: &[&str]) -> String {
    let out = Command::new(sibling_bin("kvbench"))
        .arg("up")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("kvbench");
    assert!(!out.status.success(), "kvbench up {args:?} succeeded");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn errors_under_make_name_the_make_variables() {
    let err = up_error(&[
        "--via-make",
        "--port",
        "0",
        "--prefill-endpoints",
        "127.0.0.1:9",
    ]);
    assert!(err.contains("PREFILL= needs DECODE="), "{err}");
    let err = up_error(&[
        "--via-make",
        "--port",
        "0",
        "--decode-endpoints",
        "127.0.0.1:9",
        "--pd-mode",
        "bogus",
    ]);
    assert!(err.contains("PD_MODE= must be sidecar or inline"), "{err}");
    let err = up_error(&[
        "--via-make",
        "--port",
        "0",
        "--endpoints",
        "no-such-host.invalid:80",
    ]);
    assert!(err.contains("ENDPOINTS= endpoint"), "{err}");
    // Called directly, the same errors name the flags.
    let err = up_error(&["--port", "0", "--prefill-endpoints", "127.0.0.1:9"]);
    assert!(
        err.contains("--prefill-endpoints needs --decode-endpoints"),
        "{err}"
    );

    // `make up` is what passes --via-make.
    let dry = Command::new("make")
        .current_dir(repo_root())
        .args(["-n", "up", "PORT=8085"])
        .output()
        .expect("make");
    let text = String::from_utf8_lossy(&dry.stdout);
    assert!(
        text.contains("kvbench up --via-make") && text.contains("--port 8085"),
        "{text}"
    );
}

/// `kvbench up --config FILE` runs a user's own configuration as it is, in front of the pods its
/// pools name: here YAML with one pool of simulated pods and a tie band of its own, and the
/// repeated request lands on the pod holding its prefix. A misspelt field is refused before
/// anything starts, naming it as the plugin would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn up_runs_a_users_own_configuration_and_refuses_a_misspelt_one() {
    let sim = harness::Sim::start(3, &["--time-scale", common::TIME_SCALE]).unwrap();
    let dir = std::env::temp_dir().join(format!("kvroute-up-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pods: Vec<String> = sim.pods.iter().map(|p| format!("\"{p}\"")).collect();
    let good = dir.join("kvroute.yaml");
    std::fs::write(
        &good,
        format!(
            "pools:\n  - name: mine\n    endpoints: [{}]\npoll_interval_ms: 100\ndebug_header: true\nprediction:\n  tie_band: 0.05\n",
            pods.join(", ")
        ),
    )
    .unwrap();
    let mut up = Up::start(&["--port", "0", "--config", good.to_str().unwrap()]);
    let printed = up.read_until("Ctrl-C to stop");
    assert!(
        printed.iter().any(|l| l.contains("kvroute.yaml")),
        "{printed:#?}"
    );
    let curl = printed
        .iter()
        .find(|l| l.contains("curl -si"))
        .unwrap_or_else(|| panic!("no curl line: {printed:#?}"));
    let (url, body) = parse_curl(curl.trim_start().trim_start_matches("try").trim_start());
    let client = common::fresh_client();
    let first = common::post(&client, &url, &body, &[]).await;
    assert_eq!(first.status, 200, "{}", first.body);
    assert!(sim.pods.contains(&first.pod.clone().unwrap()));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let second = common::post(&client, &url, &body, &[]).await;
    assert_eq!(
        second.debug_field("reason").as_deref(),
        Some("prefix"),
        "{:?}",
        second.debug
    );
    assert_eq!(second.pod, first.pod);
    let status = up.terminate().expect("kvbench up stops on SIGTERM");
    assert!(status.success(), "{status}");

    let bad = dir.join("bad.yaml");
    std::fs::write(
        &bad,
        format!(
            "pools:\n  - name: mine\n    endpoints: [{}]\npoll_intervall_ms: 100\n",
            pods[0]
        ),
    )
    .unwrap();
    let err = up_error(&["--port", "0", "--config", bad.to_str().unwrap()]);
    assert!(err.contains("poll_intervall_ms"), "{err}");
    let discovered = dir.join("cluster.yaml");
    std::fs::write(
        &discovered,
        "pools:\n  - name: mesh\n    cluster: outbound|8000||vllm\nadmin_cluster: kvroute_admin\n",
    )
    .unwrap();
    let err = up_error(&["--port", "0", "--config", discovered.to_str().unwrap()]);
    assert!(err.contains("pools[0] (mesh)"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
