//! The control API server: D-Bus peer to peer on a root-only unix socket. Each connection runs in
//! its own task and only sends requests to the supervisor, so a slow, broken or hostile client can
//! neither stall the supervisor nor crash it.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::UnixListener;
use tokio::sync::{Semaphore, mpsc, oneshot};
use zbus::fdo;

use crate::console::Console;
use crate::supervisor::{Request, ShutdownKind};
use nasos_api::{LogPage, OBJECT_PATH, ServiceInfo, Status, TimelineEntry};

/// Connections served at once; more are closed right away.
const MAX_CONNECTIONS: usize = 32;
/// A client must finish the D-Bus handshake within this.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

struct Control {
    requests: mpsc::Sender<Request>,
}

impl Control {
    async fn ask<T>(&self, make: impl FnOnce(oneshot::Sender<T>) -> Request) -> fdo::Result<T> {
        let (tx, rx) = oneshot::channel();
        self.requests
            .send(make(tx))
            .await
            .map_err(|_| fdo::Error::Failed("nasinit is not accepting requests".into()))?;
        rx.await.map_err(|_| fdo::Error::Failed("nasinit dropped the request".into()))
    }
}

fn invalid(e: String) -> fdo::Error {
    fdo::Error::InvalidArgs(e)
}

#[zbus::interface(name = "org.nasos.Init1")]
impl Control {
    async fn status(&self) -> fdo::Result<Status> {
        self.ask(Request::Status).await
    }

    async fn services(&self) -> fdo::Result<Vec<ServiceInfo>> {
        self.ask(Request::Services).await
    }

    async fn start(&self, name: String) -> fdo::Result<()> {
        self.ask(|tx| Request::Start(name, tx)).await?.map_err(invalid)
    }

    async fn stop(&self, name: String) -> fdo::Result<()> {
        self.ask(|tx| Request::Stop(name, tx)).await?.map_err(invalid)
    }

    async fn restart(&self, name: String) -> fdo::Result<()> {
        self.ask(|tx| Request::Restart(name, tx)).await?.map_err(invalid)
    }

    async fn logs(&self, name: String, cursor: u64, max: u32) -> fdo::Result<LogPage> {
        self.ask(|tx| Request::Logs(name, cursor, max, tx)).await?.map_err(invalid)
    }

    async fn timeline(&self) -> fdo::Result<Vec<TimelineEntry>> {
        self.ask(Request::Timeline).await
    }

    async fn debug_freeze(&self) -> fdo::Result<()> {
        self.ask(Request::Freeze).await?.map_err(fdo::Error::AccessDenied)
    }

    async fn debug_hang_shutdown(&self) -> fdo::Result<()> {
        self.ask(Request::HangShutdown).await?.map_err(fdo::Error::AccessDenied)
    }

    async fn shutdown(&self, kind: String) -> fdo::Result<()> {
        let kind = ShutdownKind::parse(&kind)
            .ok_or_else(|| invalid(format!("unknown shutdown `{kind}`: use poweroff, reboot or halt")))?;
        self.ask(|tx| Request::Shutdown(kind, tx)).await
    }
}

/// Binds the socket (root-only) and serves it for as long as the runtime runs.
pub fn serve(path: &Path, requests: mpsc::Sender<Request>, console: Console) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    let me = nix::unistd::geteuid().as_raw();
    tokio::spawn(async move {
        let guid = zbus::Guid::generate();
        let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
        loop {
            let stream = match listener.accept().await {
                Ok((s, _)) => s,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    console.say(&format!("control socket: accept failed: {e}"));
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            };
            let Ok(slot) = slots.clone().try_acquire_owned() else { continue };
            if stream.peer_cred().map(|c| c.uid() != me).unwrap_or(true) {
                continue;
            }
            let requests = requests.clone();
            let guid = guid.clone();
            tokio::spawn(async move {
                let _slot = slot;
                let Ok(stream) = stream.into_std() else { return };
                let build = zbus::connection::Builder::unix_stream(stream)
                    .server(guid)
                    .p2p()
                    .serve_at(OBJECT_PATH, Control { requests })
                    .build();
                if let Ok(Ok(conn)) = tokio::time::timeout(HANDSHAKE_TIMEOUT, build).await {
                    conn.closed().await;
                }
            });
        }
    });
    Ok(())
}
