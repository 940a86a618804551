//! A standalone `iii-shell executor --socket PATH`, as `iii-shell call --socket` and the
//! socket-peer escape cases use it.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::{bin, canon, eventually, tempdir};

/// `iii-shell executor --socket PATH [--peer-uid N]`, listening, killed on drop.
pub struct SocketExecutor {
    pub child: Child,
    pub path: PathBuf,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl SocketExecutor {
    /// An executor that lets only `peer_uid` connect.
    pub async fn start(peer_uid: u32) -> SocketExecutor {
        SocketExecutor::start_with(Some(peer_uid)).await
    }

    /// An executor with the default peer rule (its own uid).
    pub async fn start_default() -> SocketExecutor {
        SocketExecutor::start_with(None).await
    }

    async fn start_with(peer_uid: Option<u32>) -> SocketExecutor {
        let dir = tempdir();
        // World-traversable, so a refusal can only come from the socket itself.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = canon(dir.path()).join("executor.sock");
        let log = dir.path().join("executor.log");
        let mut cmd = Command::new(bin());
        cmd.args(["executor", "--socket"]).arg(&path);
        if let Some(uid) = peer_uid {
            cmd.args(["--peer-uid", &uid.to_string()]);
        }
        let child = cmd
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("spawn executor");
        let mut e = SocketExecutor {
            child,
            path,
            log,
            _dir: dir,
        };
        let up = eventually(Duration::from_secs(10), || {
            e.log().contains("executor listening")
        })
        .await;
        assert!(
            up && e.path.exists(),
            "executor is not listening; exit: {:?}; log:\n{}",
            e.child.try_wait(),
            e.log()
        );
        e
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn assert_alive(&mut self) {
        assert_eq!(
            self.child.try_wait().unwrap(),
            None,
            "executor died; log:\n{}",
            self.log()
        );
    }
}

impl Drop for SocketExecutor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
