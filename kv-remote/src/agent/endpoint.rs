//! Where calls come in: binding a Unix socket in a private directory, the
//! connection gate (how many at once, whose uid) and the guard that closes
//! an idle connection.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::error::{Error, Result};

/// Binds a Unix socket (in a runtime's context).
pub(super) fn bind_unix(path: &std::path::Path) -> Result<tokio::net::UnixListener> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(Error::Agent(format!("{}: exists and is not a socket", path.display())));
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(Error::Agent(format!("{}: another process listens there", path.display())));
        }
        std::fs::remove_file(path).map_err(|e| Error::Agent(format!("{}: {e}", path.display())))?;
    }
    // Bound in a private directory next to the path (mode 0700), made
    // 0600 there, then renamed into place: no moment where the socket
    // exists with the umask's permissions.
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => std::path::Path::new("."),
    };
    // tempfile makes the directory with mode 0700 and removes it (and the
    // staged socket, should the rename fail) when dropped.
    let private = tempfile::Builder::new()
        .prefix(".kvsds-agent-")
        .tempdir_in(parent)
        .map_err(|e| Error::Agent(format!("{}: {e}", parent.display())))?;
    let staged = private.path().join("agent.sock");
    let listener = tokio::net::UnixListener::bind(&staged)
        .map_err(|e| Error::Agent(format!("listening on {}: {e}", path.display())))?;
    std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| Error::Agent(format!("{}: {e}", path.display())))?;
    std::fs::rename(&staged, path).map_err(|e| Error::Agent(format!("{}: {e}", path.display())))?;
    Ok(listener)
}

/// The effective uid of this process (the owner of `/proc/self`).
pub(crate) fn own_uid() -> Result<u32> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").map(|m| m.uid()).map_err(|e| Error::Agent(format!("/proc/self: {e}")))
}

/// Admits connections: at most `permits` open at once, each closed after
/// `idle` without a byte read.
#[derive(Clone)]
pub(super) struct Gate {
    pub(super) permits: Arc<tokio::sync::Semaphore>,
    pub(super) idle: Duration,
    pub(super) refused: Arc<AtomicU64>,
    pub(super) idle_closed: Arc<AtomicU64>,
}

impl Gate {
    pub(super) fn admit<S>(&self, io: S) -> Option<Guarded<S>> {
        match Arc::clone(&self.permits).try_acquire_owned() {
            Ok(permit) => Some(Guarded {
                io,
                idle: self.idle,
                deadline: Box::pin(tokio::time::sleep(self.idle)),
                idle_closed: Arc::clone(&self.idle_closed),
                _permit: permit,
            }),
            Err(_) => {
                // Dropping the stream closes it.
                self.refused.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }
}

/// A connection under the gate: holds its permit until it closes, and
/// fails its reads once nothing was read for `idle`.
pub(super) struct Guarded<S> {
    pub(super) io: S,
    pub(super) idle: Duration,
    pub(super) deadline: std::pin::Pin<Box<tokio::time::Sleep>>,
    pub(super) idle_closed: Arc<AtomicU64>,
    pub(super) _permit: tokio::sync::OwnedSemaphorePermit,
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Guarded<S> {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        use std::future::Future;
        use std::task::Poll;
        let this = self.get_mut();
        let before = buf.filled().len();
        match std::pin::Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(r) => {
                if buf.filled().len() > before {
                    let next = tokio::time::Instant::now() + this.idle;
                    this.deadline.as_mut().reset(next);
                }
                Poll::Ready(r)
            }
            Poll::Pending => {
                if this.deadline.as_mut().poll(cx).is_ready() {
                    this.idle_closed.fetch_add(1, Ordering::Relaxed);
                    Poll::Ready(Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "idle control connection")))
                } else {
                    Poll::Pending
                }
            }
        }
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Guarded<S> {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }
    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }
    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

impl<S: tonic::transport::server::Connected> tonic::transport::server::Connected for Guarded<S> {
    type ConnectInfo = S::ConnectInfo;
    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}
