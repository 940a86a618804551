//! Filesystem operations, every one of them fd-relative beneath the jail.

pub mod atomic;
pub mod entry;
pub mod grep;
pub mod keep;
pub mod ops;
pub mod own_temps;
pub mod rights;
pub mod sed;
pub mod staging;
pub mod stream;
pub mod walk;
pub mod workspace;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use iii_shell_protocol::fs::{FsOp, FsReply, ReadStart};
use iii_shell_protocol::messages::ServerFrame;
use tokio::sync::{mpsc, Semaphore};

use crate::error::ExecError;
use crate::FsPolicy;
use stream::StreamItem;

/// Work that continues after the reply was sent (streaming a file out).
pub type Continuation = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The stream plumbing of one request.
pub struct RequestIo {
    pub id: u64,
    /// Chunks from the broker (streamed writes).
    pub inbound: Option<mpsc::Receiver<StreamItem>>,
    /// Frames to the broker (stream chunks and acks).
    pub out: mpsc::Sender<ServerFrame>,
    /// Credit for outbound chunks, replenished by the broker's acks.
    pub credits: Arc<Semaphore>,
    /// The staged batches of this request's broker connection.
    pub staging: staging::Staging,
}

async fn blocking<T: Send + 'static>(
    name: &'static str,
    f: impl FnOnce() -> Result<T, ExecError> + Send + 'static,
) -> Result<T, ExecError> {
    // A traced request: the filesystem work (the walk, for tree operations) is a span.
    let mut span = iii_shell_protocol::call_trace::start(name);
    let rec = iii_shell_protocol::call_trace::current();
    let r =
        tokio::task::spawn_blocking(move || iii_shell_protocol::call_trace::in_blocking(rec, f))
            .await
            .unwrap_or_else(|e| Err(ExecError::Internal(format!("fs task failed: {e}"))));
    if let (Some(s), Err(e)) = (span.as_mut(), &r) {
        s.fail(e.code().as_str());
    }
    r
}

/// Runs one filesystem operation against one policy snapshot.
pub async fn handle(
    policy: Arc<FsPolicy>,
    op: FsOp,
    io: &mut RequestIo,
) -> Result<(FsReply, Option<Continuation>), ExecError> {
    let p = policy.clone();
    let reply = match op {
        FsOp::Ls { path } => blocking("fs.ls", move || ops::ls(&p, &path).map(FsReply::Ls)).await?,
        FsOp::Stat { path } => {
            blocking("fs.stat", move || ops::stat(&p, &path).map(FsReply::Stat)).await?
        }
        FsOp::Mkdir {
            path,
            mode,
            parents,
        } => {
            blocking("fs.mkdir", move || {
                ops::mkdir(&p, &path, mode, parents).map(FsReply::Mkdir)
            })
            .await?
        }
        FsOp::Rm { path, recursive } => {
            blocking("fs.rm", move || {
                ops::rm(&p, &path, recursive).map(FsReply::Rm)
            })
            .await?
        }
        FsOp::Chmod {
            path,
            mode,
            uid,
            gid,
            recursive,
        } => {
            blocking("fs.chmod", move || {
                ops::chmod(&p, &path, mode, uid, gid, recursive).map(FsReply::Chmod)
            })
            .await?
        }
        FsOp::Mv {
            src,
            dst,
            overwrite,
        } => {
            blocking("fs.mv", move || {
                ops::mv(&p, &src, &dst, overwrite).map(FsReply::Mv)
            })
            .await?
        }
        FsOp::Grep(spec) => {
            blocking("fs.grep", move || grep::grep(&p, &spec).map(FsReply::Grep)).await?
        }
        FsOp::Sed(spec) => {
            blocking("fs.sed", move || sed::sed(&p, &spec).map(FsReply::Sed)).await?
        }
        FsOp::Write { files } => {
            blocking("fs.write", move || {
                ops::write_inline(&p, &files).map(FsReply::Write)
            })
            .await?
        }
        FsOp::WriteStream {
            path,
            mode,
            parents,
        } => {
            let mut inbound = io
                .inbound
                .take()
                .ok_or_else(|| ExecError::Internal("no input stream".into()))?;
            let (out, id) = (io.out.clone(), io.id);
            let ack = move || {
                let _ = out.try_send(ServerFrame::StreamAck { id });
            };
            let r = stream::write_stream(&policy, &path, mode, parents, &mut inbound, ack).await;
            // Drain whatever the broker still sends so its window never blocks on us.
            tokio::spawn(async move { while inbound.recv().await.is_some() {} });
            FsReply::Write(r?)
        }
        FsOp::WriteStage {
            batch,
            index,
            count,
            path,
            mode,
            parents,
        } => {
            let mut inbound = io
                .inbound
                .take()
                .ok_or_else(|| ExecError::Internal("no input stream".into()))?;
            let (out, id) = (io.out.clone(), io.id);
            let ack = move || {
                let _ = out.try_send(ServerFrame::StreamAck { id });
            };
            let r = staging::stage(
                &io.staging,
                &policy,
                batch,
                index as usize,
                count as usize,
                &path,
                mode,
                parents,
                &mut inbound,
                ack,
            )
            .await;
            tokio::spawn(async move { while inbound.recv().await.is_some() {} });
            FsReply::Write(r?)
        }
        FsOp::WriteCommit { batch } => {
            let st = io.staging.clone();
            blocking("fs.write", move || {
                staging::commit(&st, batch).map(FsReply::Write)
            })
            .await?
        }
        FsOp::WriteAbort { batch } => {
            let st = io.staging.clone();
            blocking("fs.write_abort", move || {
                staging::abort(&st, batch);
                Ok(FsReply::Write(iii_shell_protocol::fs::WriteResponse {
                    bytes_written: 0,
                    path: String::new(),
                    files: Vec::new(),
                }))
            })
            .await?
        }
        FsOp::Read { path } => {
            let (file, st, _) =
                blocking("fs.read", move || ops::open_for_read(&p, &path, true)).await?;
            let start = ReadStart {
                size: st.st_size as u64,
                mode: iii_shell_protocol::fs::mode_string(st.st_mode),
                mtime: st.st_mtime,
            };
            let cont = stream::read_stream(
                file,
                io.id,
                io.out.clone(),
                io.credits.clone(),
                policy.config.fs.max_read_bytes,
            );
            return Ok((FsReply::ReadStart(start), Some(Box::pin(cont))));
        }
        FsOp::WorkspaceRoots => FsReply::WorkspaceRoots(workspace::roots(&policy)),
        FsOp::WorkspaceList { path, page_size } => {
            blocking("fs.list", move || {
                workspace::list(&p, &path, page_size).map(FsReply::WorkspaceList)
            })
            .await?
        }
        FsOp::WorkspaceValidate { path } => {
            blocking("fs.validate", move || {
                workspace::validate(&p, &path).map(FsReply::WorkspaceValidate)
            })
            .await?
        }
        FsOp::WorkspaceReadBytes {
            path,
            offset,
            length,
        } => {
            blocking("fs.read_bytes", move || {
                workspace::read_bytes(&p, &path, offset, length).map(FsReply::WorkspaceReadBytes)
            })
            .await?
        }
    };
    Ok((reply, None))
}
