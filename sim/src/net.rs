//! A pod's listening socket, with the "refuse" fault: a pod that stops accepting connections.
//!
//! A crashed or partitioned pod refuses connections rather than answering errors, and a router must
//! tell the two apart (retry on another host, mark it unhealthy). While refusing, the listener is
//! closed outright so connects fail with ECONNREFUSED; when the fault clears, the same port is bound
//! again (SO_REUSEADDR). Established keep-alive connections are cut as soon as the client sends a new
//! request on them, so a pooled client cannot slip past the fault; responses already under way (the
//! reply to the fault request itself, streams in flight) still complete.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::watch;

pub fn bind_reuse(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(1024)
}

pub struct RefusableListener {
    inner: Option<TcpListener>,
    addr: SocketAddr,
    refuse: watch::Receiver<bool>,
    /// Mirrors `refuse` for the synchronous check in `GuardedStream::poll_read`.
    refused: Arc<AtomicBool>,
    /// Whether the port is open, so a fault request can answer only once it took effect.
    listening: watch::Sender<bool>,
}

impl RefusableListener {
    /// Wraps a bound listener; the returned switch is how the pod flips the fault.
    pub fn new(listener: TcpListener) -> io::Result<(Self, RefuseSwitch)> {
        let (refuse_tx, refuse) = watch::channel(false);
        let (listening, listening_rx) = watch::channel(true);
        let refused = Arc::new(AtomicBool::new(false));
        let this = Self {
            addr: listener.local_addr()?,
            inner: Some(listener),
            refuse,
            refused: refused.clone(),
            listening,
        };
        let switch = RefuseSwitch {
            refuse_tx,
            listening: listening_rx,
            refused,
        };
        Ok((this, switch))
    }
}

/// The pod's side of the listener: turns the fault on and off and learns when it took effect.
pub struct RefuseSwitch {
    refuse_tx: watch::Sender<bool>,
    listening: watch::Receiver<bool>,
    refused: Arc<AtomicBool>,
}

impl RefuseSwitch {
    pub fn set(&self, refuse: bool) {
        self.refused.store(refuse, Ordering::SeqCst);
        self.refuse_tx.send_replace(refuse);
    }

    /// Waits (up to `limit`) until the port is closed (`refuse`) or open again.
    pub async fn settled(&self, refuse: bool, limit: Duration) {
        let mut listening = self.listening.clone();
        let _ = tokio::time::timeout(limit, listening.wait_for(|open| *open != refuse)).await;
    }

    /// On shutdown: cut idle keep-alive connections at their next request.
    pub fn cut_connections(&self) {
        self.refused.store(true, Ordering::SeqCst);
    }
}

impl axum::serve::Listener for RefusableListener {
    type Io = GuardedStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            if *self.refuse.borrow_and_update() {
                self.inner = None;
                self.listening.send_replace(false);
                if self.refuse.wait_for(|refusing| !*refusing).await.is_err() {
                    // The pod is gone; its server task is about to be dropped.
                    std::future::pending::<()>().await;
                }
                continue;
            }
            let listener = match &self.inner {
                Some(l) => l,
                None => match bind_reuse(self.addr) {
                    Ok(l) => {
                        self.listening.send_replace(true);
                        self.inner.insert(l)
                    }
                    Err(e) => {
                        eprintln!("kvsim {}: cannot rebind after refuse: {e}", self.addr);
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, peer)) => {
                        if self.refused.load(Ordering::SeqCst) {
                            continue;
                        }
                        // Streaming one small chunk per token must not wait for Nagle.
                        let _ = stream.set_nodelay(true);
                        return (
                            GuardedStream { inner: stream, refused: self.refused.clone() },
                            peer,
                        );
                    }
                    // Typically EMFILE: back off instead of spinning.
                    Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                },
                changed = self.refuse.changed() => {
                    if changed.is_err() {
                        std::future::pending::<()>().await;
                    }
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.addr)
    }
}

/// A TCP connection that fails as soon as the client sends more bytes while the pod is refusing.
pub struct GuardedStream {
    inner: TcpStream,
    refused: Arc<AtomicBool>,
}

impl AsyncRead for GuardedStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(()))
                if buf.filled().len() > before && this.refused.load(Ordering::SeqCst) =>
            {
                Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::ConnectionReset,
                    "pod is refusing connections",
                )))
            }
            other => other,
        }
    }
}

impl AsyncWrite for GuardedStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}
