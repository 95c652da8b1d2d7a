//! One request, timed: a persistent HTTP/1.1 connection to one Envoy listener, the latency from
//! before the request is written to the last byte of the answer, and the outcome as a [`Sample`].
//! Kept small and apart because it is the client's whole share of every figure: both arms must pay
//! for exactly the same client work.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::driver::POD_HEADER;

/// One request's outcome.
pub(super) struct Sample {
    pub(super) status: u16,
    pub(super) pod: Option<String>,
    pub(super) latency: Duration,
    pub(super) error: Option<String>,
}

impl Sample {
    pub(super) fn ok(&self) -> bool {
        self.status == 200 && self.error.is_none()
    }
}

/// Longest wait for one answer.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// What came back on a [`Conn`].
struct Answer {
    status: u16,
    pod: Option<String>,
    body: Bytes,
}

/// One persistent HTTP/1.1 connection to an Envoy listener (hyper's connection-level client),
/// opened on first use and again after a failure. One connection per arm, not a pool, so one Envoy
/// worker takes every request of the sequential phase and the client's work is the same for both.
pub(super) struct Conn {
    addr: String,
    sender: Option<SendRequest<Full<Bytes>>>,
}

impl Conn {
    pub(super) fn new(addr: &str) -> Self {
        Self {
            addr: addr.to_owned(),
            sender: None,
        }
    }

    /// Sends one request body (from [`http_request`]) and reads the whole answer; the latency runs
    /// from before the request is written to the last byte of the body.
    pub(super) async fn send(&mut self, body: &Bytes) -> Sample {
        let start = Instant::now();
        let result = tokio::time::timeout(REQUEST_TIMEOUT, self.exchange(body.clone())).await;
        let latency = start.elapsed();
        let (status, pod, error) = match result {
            Ok(Ok(a)) if a.status != 200 => {
                let text = String::from_utf8_lossy(a.body.get(..200).unwrap_or(&a.body));
                let error = format!("http {}: {text}", a.status);
                (a.status, a.pod, Some(error))
            }
            Ok(Ok(a)) if a.body.is_empty() => (a.status, a.pod, Some("empty body".to_owned())),
            Ok(Ok(a)) => (a.status, a.pod, None),
            Ok(Err(e)) => (0, None, Some(format!("{e:#}"))),
            Err(_) => (0, None, Some("timeout".to_owned())),
        };
        if error.is_some() {
            self.sender = None;
        }
        Sample {
            status,
            pod,
            latency,
            error,
        }
    }

    async fn exchange(&mut self, body: Bytes) -> Result<Answer> {
        let sender = match &mut self.sender {
            Some(s) if !s.is_closed() => s,
            slot => {
                let tcp = TcpStream::connect(&self.addr)
                    .await
                    .with_context(|| format!("connecting to {}", self.addr))?;
                tcp.set_nodelay(true)?;
                let (sender, connection) = http1::handshake(TokioIo::new(tcp)).await?;
                tokio::spawn(connection);
                slot.insert(sender)
            }
        };
        sender.ready().await.context("connection")?;
        let request = hyper::Request::post("/v1/chat/completions")
            .header("host", "kvbench")
            .header("content-type", "application/json")
            .body(Full::new(body))?;
        let response = sender.send_request(request).await.context("request")?;
        let status = response.status().as_u16();
        let pod = response
            .headers()
            .get(POD_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let body = response
            .into_body()
            .collect()
            .await
            .context("body")?
            .to_bytes();
        Ok(Answer { status, pod, body })
    }
}

pub(super) fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}
