//! The change feed's watchers (`shell::changed`): one recursive inotify watcher (the
//! `notify` crate) per trigger binding, under the same path policy as the fs surface.
//!
//! * The root goes through the jail (`Jail::resolve`: containment, denylist, canonical path)
//!   and must be a directory. The watcher is set on the canonical path with symlinks not
//!   followed, and the path is checked against the resolved descriptor once the watch is set,
//!   so a root swapped for a symlink in between is refused.
//! * Raw events go through a bounded channel into a coalescer task (`coalesce`): per path, a
//!   200 ms window opened by its first event, kinds merged toward the visible outcome
//!   ([`ChangeKind::merge`]); at the window's end one [`Event::Changed`] batch is pushed.
//! * A new directory's own watch is set only after its creation event, so what was written
//!   into it in between raised no event: when a created directory's window closes, its
//!   entries (recursively, symlinks not followed) are reported as `created` too, unless they
//!   are pending already; more than `watch.max_pending_paths` of them, or a directory that
//!   cannot be listed (deeper than the kernel's path limit), is the overflow signal.
//! * Paths the policy denies, `.git` internals and (unless `include_ignored`) ignored paths
//!   are never delivered (`filter`).
//! * Nothing is ever lost silently: a kernel queue overflow, a watch limit reached while the
//!   tree grows, a full raw-event channel or more than `watch.max_pending_paths` paths in one
//!   window all turn into the overflow signal — one change for the root (`.`), kind
//!   `modified`, `overflow: true` — and an ERROR log line.

pub mod filter;

use std::collections::{HashMap, VecDeque};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use iii_shell_policy::sync::lock;
use iii_shell_protocol::messages::Event;
use iii_shell_protocol::watch::{Change, ChangeKind, WatchReply};
use notify::event::{ModifyKind, RenameMode};
use notify::{EventKind, RecursiveMode, Watcher};
use tokio::sync::{broadcast, mpsc, Notify};
use tokio::time::Instant;

use crate::policy::Policy;
use iii_shell_files::error::ExecError;

/// The coalescing window (TRIG-06).
pub const WINDOW: Duration = Duration::from_millis(200);
/// Raw events buffered between the kernel reader thread and the coalescer.
const RAW_QUEUE: usize = 8192;

struct Running {
    root: PathBuf,
    path: String,
    include_ignored: bool,
    _watcher: notify::RecommendedWatcher,
    _root_fd: OwnedFd,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Every live watcher of this executor, by binding id.
pub struct Watches {
    running: Mutex<HashMap<String, Running>>,
    events: broadcast::Sender<Event>,
}

impl Watches {
    pub fn new(events: broadcast::Sender<Event>) -> Watches {
        Watches {
            running: Mutex::default(),
            events,
        }
    }

    pub fn len(&self) -> usize {
        lock(&self.running).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Starts the watcher of `binding_id` (or keeps the live one when nothing changed).
    pub fn start(
        &self,
        policy: Arc<Policy>,
        binding_id: &str,
        path: &str,
        include_ignored: bool,
    ) -> Result<WatchReply, ExecError> {
        if binding_id.is_empty() || binding_id.len() > 256 {
            return Err(ExecError::Invalid("binding id must be 1-256 bytes".into()));
        }
        let resolved = policy
            .jail
            .resolve_with(path, libc::O_PATH | libc::O_DIRECTORY);
        let resolved = match resolved {
            Ok(r) => r,
            Err(ExecError::NotFound(p)) => {
                // Missing, denied, or not a directory: tell which only when it is visible.
                if policy.jail.resolve(path).is_ok() {
                    return Err(ExecError::WrongType(format!(
                        "{p}: not a directory (shell::changed watches directories)"
                    )));
                }
                return Err(ExecError::NotFound(p));
            }
            Err(e) => return Err(e),
        };
        {
            let running = lock(&self.running);
            if let Some(r) = running.get(binding_id) {
                if r.path == path && r.include_ignored == include_ignored && r.root == resolved.path
                {
                    return Ok(WatchReply::Started {
                        root: r.root.to_string_lossy().into_owned(),
                        kept: true,
                    });
                }
            }
            let max = policy.config.watch.max_watchers as usize;
            let others = running.len() - usize::from(running.contains_key(binding_id));
            if others >= max {
                return Err(ExecError::Invalid(format!(
                    "this worker already serves {others} shell::changed watchers (watch.max_watchers = {max}); unbind one or raise watch.max_watchers"
                )));
            }
        }
        let root = resolved.path.clone();
        // notify walks and watches by path; inotify resolves each path itself. The tree is
        // watched through its canonical path with symlinks not followed, and the root is
        // checked against the resolved descriptor after the watch is set (a root swapped for a
        // symlink in between is refused).
        let via = root.clone();
        let (tx, rx) = mpsc::channel::<notify::Event>(RAW_QUEUE);
        let lost = Arc::new(AtomicBool::new(false));
        let wake = Arc::new(Notify::new());
        let handler = {
            let (lost, wake) = (lost.clone(), wake.clone());
            let id = binding_id.to_string();
            move |res: notify::Result<notify::Event>| match res {
                Ok(ev) => {
                    if tx.try_send(ev).is_err() {
                        lost.store(true, Ordering::SeqCst);
                        wake.notify_one();
                    }
                }
                Err(e) => {
                    tracing::error!(binding = %id, error = %e, "a shell::changed watcher lost events ({e}); the subscriber gets an overflow signal. If this is the inotify watch limit, raise fs.inotify.max_user_watches (sysctl) or watch a smaller tree");
                    lost.store(true, Ordering::SeqCst);
                    wake.notify_one();
                }
            }
        };
        let config = notify::Config::default().with_follow_symlinks(false);
        let mut watcher = notify::RecommendedWatcher::new(handler, config).map_err(|e| {
            ExecError::Invalid(format!(
                "cannot create an inotify watcher ({e}); raise fs.inotify.max_user_instances (sysctl) or unbind other watchers"
            ))
        })?;
        watcher
            .watch(&via, RecursiveMode::Recursive)
            .map_err(|e| match e.kind {
                notify::ErrorKind::MaxFilesWatch => ExecError::Invalid(format!(
                    "{path}: the inotify watch limit was reached while watching this tree; raise fs.inotify.max_user_watches (sysctl) or watch a smaller directory"
                )),
                _ => ExecError::Internal(format!("watch {path}: {e}")),
            })?;
        if !same_file(&resolved.fd, &root) {
            return Err(ExecError::NotFound(path.to_string()));
        }
        let filter = filter::Filter::build(&root, &via, include_ignored);
        let task = tokio::spawn(coalesce(Coalescer {
            binding_id: binding_id.to_string(),
            root: root.clone(),
            via,
            filter,
            include_ignored,
            policy: policy.clone(),
            max_pending: policy.config.watch.max_pending_paths.max(1) as usize,
            rx,
            lost,
            wake,
            events: self.events.clone(),
        }));
        let running = Running {
            root: root.clone(),
            path: path.to_string(),
            include_ignored,
            _watcher: watcher,
            _root_fd: resolved.fd,
            task,
        };
        lock(&self.running).insert(binding_id.to_string(), running);
        tracing::info!(binding = %binding_id, root = %root.display(), "shell::changed watcher started");
        Ok(WatchReply::Started {
            root: root.to_string_lossy().into_owned(),
            kept: false,
        })
    }

    pub fn stop(&self, binding_id: &str) -> WatchReply {
        let gone = lock(&self.running).remove(binding_id);
        if gone.is_some() {
            tracing::info!(binding = %binding_id, "shell::changed watcher stopped");
        }
        WatchReply::Stopped {
            existed: gone.is_some(),
        }
    }

    /// Stops every watcher (the broker connection ended; it starts them again).
    pub fn clear(&self) {
        lock(&self.running).clear();
    }
}

struct Coalescer {
    binding_id: String,
    root: PathBuf,
    via: PathBuf,
    filter: filter::Filter,
    include_ignored: bool,
    policy: Arc<Policy>,
    max_pending: usize,
    rx: mpsc::Receiver<notify::Event>,
    lost: Arc<AtomicBool>,
    wake: Arc<Notify>,
    events: broadcast::Sender<Event>,
}

/// Raw event → (path, kind) pairs; `None` for events that change nothing visible.
fn raw_kinds(ev: &notify::Event) -> Vec<(PathBuf, ChangeKind)> {
    let each = |k: ChangeKind| ev.paths.iter().map(|p| (p.clone(), k)).collect();
    match &ev.kind {
        EventKind::Create(_) => each(ChangeKind::Created),
        EventKind::Remove(_) => each(ChangeKind::Deleted),
        EventKind::Modify(ModifyKind::Name(RenameMode::From)) => each(ChangeKind::Deleted),
        EventKind::Modify(ModifyKind::Name(RenameMode::To)) => each(ChangeKind::Created),
        EventKind::Modify(ModifyKind::Name(RenameMode::Both)) => {
            let mut v = Vec::new();
            if let Some(p) = ev.paths.first() {
                v.push((p.clone(), ChangeKind::Deleted));
            }
            if let Some(p) = ev.paths.get(1) {
                v.push((p.clone(), ChangeKind::Created));
            }
            v
        }
        EventKind::Modify(ModifyKind::Name(_)) => ev
            .paths
            .iter()
            .map(|p| {
                let k = if p.symlink_metadata().is_ok() {
                    ChangeKind::Created
                } else {
                    ChangeKind::Deleted
                };
                (p.clone(), k)
            })
            .collect(),
        EventKind::Modify(_) => each(ChangeKind::Modified),
        EventKind::Access(_) | EventKind::Any | EventKind::Other => Vec::new(),
    }
}

fn overflow_change() -> Change {
    Change {
        path: ".".into(),
        kind: ChangeKind::Modified,
        dir: true,
        overflow: true,
    }
}

async fn coalesce(mut c: Coalescer) {
    let mut pending: HashMap<PathBuf, ChangeKind> = HashMap::new();
    let mut order: VecDeque<(Instant, PathBuf)> = VecDeque::new();
    loop {
        let due = order.front().map(|(d, _)| *d);
        tokio::select! {
            ev = c.rx.recv() => {
                let Some(ev) = ev else { return };
                if ev.need_rescan() {
                    c.lost.store(true, Ordering::SeqCst);
                }
                for (abs, kind) in raw_kinds(&ev) {
                    let Ok(rel) = abs.strip_prefix(&c.via) else { continue };
                    let rel = rel.to_path_buf();
                    if rel.as_os_str().is_empty() {
                        continue;
                    }
                    if rel == Path::new(".gitignore") && !c.include_ignored {
                        c.filter = filter::Filter::build(&c.root, &c.via, false);
                    }
                    match pending.get_mut(&rel) {
                        Some(k) => *k = k.merge(kind),
                        None => {
                            pending.insert(rel.clone(), kind);
                            order.push_back((Instant::now() + WINDOW, rel));
                        }
                    }
                }
                if pending.len() > c.max_pending {
                    tracing::error!(binding = %c.binding_id, paths = pending.len(), "a shell::changed window exceeded watch.max_pending_paths; sending one overflow signal instead (raise watch.max_pending_paths to get per-path events for bursts this large)");
                    c.lost.store(true, Ordering::SeqCst);
                }
            }
            _ = sleep_until(due), if due.is_some() => {}
            _ = c.wake.notified() => {}
        }
        if c.lost.swap(false, Ordering::SeqCst) {
            pending.clear();
            order.clear();
            let _ = c.events.send(Event::Changed {
                binding_id: c.binding_id.clone(),
                changes: vec![overflow_change()],
            });
            continue;
        }
        let now = Instant::now();
        let mut changes = Vec::new();
        while order.front().is_some_and(|(d, _)| *d <= now) {
            let Some((_, rel)) = order.pop_front() else {
                break;
            };
            let Some(kind) = pending.remove(&rel) else {
                continue;
            };
            let is_dir = kind != ChangeKind::Deleted
                && c.via
                    .join(&rel)
                    .symlink_metadata()
                    .is_ok_and(|m| m.is_dir());
            if !c.filter.delivers(&rel, is_dir)
                || is_own_unnamed(&c.via, &rel)
                || c.policy.jail.is_denied(&c.root.join(&rel))
            {
                continue;
            }
            changes.push(Change {
                path: rel.to_string_lossy().into_owned(),
                kind,
                dir: is_dir,
                overflow: false,
            });
            if is_dir && kind == ChangeKind::Created {
                // What was written into a new directory before its own watch was set raised
                // no event: report its contents once, now that the window has passed.
                let mut found = Vec::new();
                if !list_new_dir(&c.via, &rel, c.max_pending, &mut found) {
                    tracing::error!(binding = %c.binding_id, "a new directory in a shell::changed tree cannot be listed in full (more than watch.max_pending_paths entries, or deeper than the kernel's path limit); sending one overflow signal instead (raise watch.max_pending_paths, or keep trees shallower than PATH_MAX)");
                    c.lost.store(true, Ordering::SeqCst);
                    break;
                }
                for (sub, dir) in found {
                    if pending.contains_key(&sub)
                        || !c.filter.delivers(&sub, dir)
                        || c.policy.jail.is_denied(&c.root.join(&sub))
                    {
                        continue;
                    }
                    changes.push(Change {
                        path: sub.to_string_lossy().into_owned(),
                        kind: ChangeKind::Created,
                        dir,
                        overflow: false,
                    });
                }
            }
        }
        if c.lost.load(Ordering::SeqCst) {
            c.wake.notify_one();
            continue;
        }
        if !changes.is_empty() {
            let _ = c.events.send(Event::Changed {
                binding_id: c.binding_id.clone(),
                changes,
            });
        }
    }
}

/// Every entry under `via/rel` (symlinks not followed), root-relative, with whether it is a
/// directory; false when there are more than `cap`, or a directory cannot be listed (its path
/// is beyond the kernel's path limit, so it is not watched either): a gap the subscriber must
/// hear of. A directory gone or replaced since is no gap: that change has its own event.
fn list_new_dir(via: &Path, rel: &Path, cap: usize, out: &mut Vec<(PathBuf, bool)>) -> bool {
    let entries = match std::fs::read_dir(via.join(rel)) {
        Ok(entries) => entries,
        Err(e) => {
            return e.kind() == std::io::ErrorKind::NotFound
                || e.raw_os_error() == Some(libc::ENOTDIR)
        }
    };
    for e in entries.flatten() {
        let sub = rel.join(e.file_name());
        let dir = e.file_type().is_ok_and(|t| t.is_dir());
        if out.len() >= cap {
            return false;
        }
        out.push((sub.clone(), dir));
        if dir && !filter::is_git_internal(&sub) && !list_new_dir(via, &sub, cap, out) {
            return false;
        }
    }
    true
}

/// True when `rel` is the pseudo-name (`#<inode>`) under which the kernel reports the
/// writes of one of the executor's own unnamed temp files (`O_TMPFILE`, see
/// `iii_shell_files::fs::own_temps`): the name is in the executor's record and no entry of
/// that name exists. A user's file called `#<number>` is an entry, and is reported.
pub fn is_own_unnamed(via: &Path, rel: &Path) -> bool {
    use iii_shell_files::fs::own_temps;
    rel.file_name()
        .is_some_and(|n| own_temps::looks_unnamed(n) && own_temps::is_own(n))
        && via.join(rel).symlink_metadata().is_err()
}

/// True when `path` (not followed) is the directory `fd` names.
fn same_file(fd: &OwnedFd, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(st) = iii_shell_files::jail::fstat(fd) else {
        return false;
    };
    path.symlink_metadata()
        .is_ok_and(|m| m.is_dir() && m.dev() == st.st_dev && m.ino() == st.st_ino)
}

async fn sleep_until(due: Option<Instant>) {
    match due {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod hostile_tests;

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn policy(root: &Path, tweak: impl FnOnce(&mut serde_json::Value)) -> Arc<Policy> {
        let mut v = serde_json::json!({"fs": {"host_roots": [root.to_string_lossy()]}});
        tweak(&mut v);
        Arc::new(Policy::build(1, &v.to_string()).expect("policy"))
    }

    pub(super) async fn next_changes(rx: &mut broadcast::Receiver<Event>) -> Vec<Change> {
        match tokio::time::timeout(Duration::from_secs(5), rx.recv()).await {
            Ok(Ok(Event::Changed { changes, .. })) => changes,
            other => panic!("no change event: {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_watcher_coalesces_a_create_and_its_writes_into_one_created() {
        let d = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(d.path()).unwrap();
        let (tx, mut rx) = broadcast::channel(64);
        let w = Watches::new(tx);
        let r = w.start(policy(&root, |_| {}), "b", &root.to_string_lossy(), false);
        assert!(
            matches!(r, Ok(WatchReply::Started { kept: false, .. })),
            "{r:?}"
        );
        std::fs::write(root.join("a.txt"), "1").unwrap();
        std::fs::write(root.join("a.txt"), "2").unwrap();
        let c = next_changes(&mut rx).await;
        assert_eq!(
            c,
            vec![Change {
                path: "a.txt".into(),
                kind: ChangeKind::Created,
                dir: false,
                overflow: false
            }]
        );
        let again = w.start(policy(&root, |_| {}), "b", &root.to_string_lossy(), false);
        assert!(
            matches!(again, Ok(WatchReply::Started { kept: true, .. })),
            "{again:?}"
        );
        assert_eq!(w.stop("b"), WatchReply::Stopped { existed: true });
        std::fs::write(root.join("b.txt"), "1").unwrap();
        assert!(tokio::time::timeout(Duration::from_millis(500), rx.recv())
            .await
            .is_err());
    }

    /// Every atomic write (a temp file beside its target, unnamed where the filesystem
    /// allows) reports its target alone: never the temp file's name, nor the `#<inode>`
    /// pseudo-name the kernel gives an unnamed one. A user's files that look like those
    /// names are still reported.
    #[tokio::test]
    async fn atomic_writes_report_their_target_alone_and_lookalikes_are_reported() {
        let d = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(d.path()).unwrap();
        let (tx, mut rx) = broadcast::channel(1024);
        let w = Watches::new(tx);
        let p = policy(&root, |_| {});
        w.start(p.clone(), "b", &root.to_string_lossy(), true)
            .unwrap();
        for i in 0..20 {
            let parent = p.jail.parent(&format!("f{i}.txt"), false).unwrap();
            iii_shell_files::fs::atomic::write_atomic(&parent, b"data", 0o644, None).unwrap();
        }
        std::fs::write(root.join("#12"), "user").unwrap();
        let lookalike = ".f0.txt.iii-0123456789abcdef0123456789abcdef.tmp";
        std::fs::write(root.join(lookalike), "user").unwrap();
        let mut got = Vec::new();
        let until = Instant::now() + Duration::from_secs(2);
        while let Ok(Ok(Event::Changed { changes, .. })) =
            tokio::time::timeout_at(until, rx.recv()).await
        {
            got.extend(changes.into_iter().map(|c| c.path));
        }
        got.sort();
        let mut want: Vec<String> = (0..20).map(|i| format!("f{i}.txt")).collect();
        want.push("#12".into());
        want.push(lookalike.into());
        want.sort();
        assert_eq!(got, want);
    }

    #[tokio::test]
    async fn a_file_a_missing_path_and_the_watcher_limit_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(d.path()).unwrap();
        std::fs::write(root.join("f"), "x").unwrap();
        let (tx, _rx) = broadcast::channel(64);
        let w = Watches::new(tx);
        let p = policy(&root, |v| {
            v["watch"] = serde_json::json!({"max_watchers": 1})
        });
        let f = w.start(p.clone(), "f", &root.join("f").to_string_lossy(), false);
        assert_eq!(f.unwrap_err().code(), iii_shell_protocol::Code::S212);
        let m = w.start(p.clone(), "m", &root.join("nope").to_string_lossy(), false);
        assert_eq!(m.unwrap_err().code(), iii_shell_protocol::Code::S211);
        w.start(p.clone(), "one", &root.to_string_lossy(), false)
            .unwrap();
        let two = w.start(p.clone(), "two", &root.to_string_lossy(), false);
        assert!(two
            .unwrap_err()
            .to_string()
            .contains("watch.max_watchers = 1"));
    }
}
