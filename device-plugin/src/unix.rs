//! gRPC over unix sockets, both ways.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tonic::transport::{Channel, Endpoint};

/// A channel to the gRPC server on the unix socket `path` (connected at once, within
/// `timeout`; each call also times out after `timeout`).
pub async fn connect(path: &Path, timeout: Duration) -> Result<Channel, tonic::transport::Error> {
    let path: PathBuf = path.to_owned();
    // The URI is not used for unix sockets; the connector below names the socket.
    Endpoint::from_static("http://localhost")
        .connect_timeout(timeout)
        .timeout(timeout)
        .connect_with_connector(tower::service_fn(move |_| {
            let path = path.clone();
            async move {
                let s = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(s))
            }
        }))
        .await
}

/// The incoming connections of a listener bound at `path` (an old file there is removed
/// first).
pub fn serve_on(path: &Path) -> std::io::Result<tokio_stream::wrappers::UnixListenerStream> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let l = tokio::net::UnixListener::bind(path)?;
    Ok(tokio_stream::wrappers::UnixListenerStream::new(l))
}
