//! The names under which the executor's own temp files ([`super::atomic`]) show up in a
//! directory's inotify events, so the change feed can leave exactly those out.
//!
//! * An unnamed temp file (`O_TMPFILE`) has no entry in its directory, but the kernel reports
//!   its writes, mode changes and close to the directory's watchers under the pseudo-name
//!   `#<inode number>`.
//! * A temp file with a name (`.<name>.iii-<32 hex>.tmp`: the link just before the rename, a
//!   batch's pre-image, the fallback where `O_TMPFILE` is missing) shows up under that name.
//!
//! Every such name is recorded here while its file is in use and for [`GRACE`] after (events
//! reach the watcher's reader a little later than they happen). The record is the truth, not
//! the shape of the name: a user's file that merely looks like one (`#12`, `.a.iii-….tmp`) is
//! never in it. At most [`MAX_RELEASED`] released names are kept (the oldest go first), so
//! the record stays small however many writes there are.

use std::collections::{HashMap, VecDeque};
use std::ffi::OsStr;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use iii_shell_policy::sync::lock;

/// How long a released name is still known as the executor's own.
pub const GRACE: Duration = Duration::from_secs(60);
/// Released names kept at most (about 100 bytes each).
pub const MAX_RELEASED: usize = 65_536;

#[derive(Default)]
struct Record {
    /// Name → number of live holders (0: released, kept until its entry in `released` goes).
    names: HashMap<Vec<u8>, (usize, Option<Instant>)>,
    released: VecDeque<(Instant, Vec<u8>)>,
}

fn record() -> &'static Mutex<Record> {
    static RECORD: OnceLock<Mutex<Record>> = OnceLock::new();
    RECORD.get_or_init(Mutex::default)
}

/// The pseudo-name of an unnamed temp file with inode `ino`.
pub fn unnamed(ino: u64) -> Vec<u8> {
    format!("#{ino}").into_bytes()
}

/// Records `name` as one of the executor's own temp files, in use until [`release`].
pub fn hold(name: &[u8]) {
    let mut r = lock(record());
    let e = r.names.entry(name.to_vec()).or_insert((0, None));
    e.0 += 1;
    e.1 = None;
}

/// `name` (held before) is no longer in use; it stays known for [`GRACE`].
pub fn release(name: &[u8]) {
    let now = Instant::now();
    let mut r = lock(record());
    let Some(e) = r.names.get_mut(name) else {
        return;
    };
    e.0 = e.0.saturating_sub(1);
    if e.0 > 0 {
        return;
    }
    e.1 = Some(now);
    r.released.push_back((now, name.to_vec()));
    prune(&mut r, now);
}

fn prune(r: &mut Record, now: Instant) {
    while let Some((at, _)) = r.released.front() {
        if now.duration_since(*at) < GRACE && r.released.len() <= MAX_RELEASED {
            break;
        }
        let Some((at, name)) = r.released.pop_front() else {
            break;
        };
        // Only when it was not held (or released again) since.
        if r.names
            .get(&name)
            .is_some_and(|e| e.0 == 0 && e.1 == Some(at))
        {
            r.names.remove(&name);
        }
    }
}

/// True when `name` (a file name, no `/`) is one of the executor's own temp files, in use
/// or released less than [`GRACE`] ago.
pub fn is_own(name: &OsStr) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let now = Instant::now();
    let mut r = lock(record());
    prune(&mut r, now);
    r.names.contains_key(name.as_bytes())
}

/// True when `name` has the shape of an unnamed temp file's pseudo-name (`#` and digits).
pub fn looks_unnamed(name: &OsStr) -> bool {
    use std::os::unix::ffi::OsStrExt;
    name.as_bytes()
        .strip_prefix(b"#")
        .is_some_and(|d| !d.is_empty() && d.iter().all(u8::is_ascii_digit))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_name_is_own_until_well_after_its_release_and_lookalikes_never_are() {
        let n = unnamed(u64::MAX - 7);
        assert!(!is_own(OsStr::new("#18446744073709551608")));
        hold(&n);
        hold(&n);
        assert!(is_own(OsStr::new("#18446744073709551608")));
        release(&n);
        release(&n);
        // Released: still known (the watcher reads events a little late).
        assert!(is_own(OsStr::new("#18446744073709551608")));
        assert!(!is_own(OsStr::new("#18446744073709551607")));
        assert!(looks_unnamed(OsStr::new("#12")));
        assert!(!looks_unnamed(OsStr::new("#")));
        assert!(!looks_unnamed(OsStr::new("#1a")));
        assert!(!looks_unnamed(OsStr::new("12")));
    }

    #[test]
    fn the_record_keeps_at_most_max_released_names() {
        let mut r = Record::default();
        let now = Instant::now();
        for i in 0..(MAX_RELEASED + 10) {
            let name = format!(".x.iii-{i}.tmp").into_bytes();
            r.names.insert(name.clone(), (0, Some(now)));
            r.released.push_back((now, name));
            prune(&mut r, now);
        }
        assert_eq!(r.released.len(), MAX_RELEASED);
        assert_eq!(r.names.len(), MAX_RELEASED);
        assert!(!r.names.contains_key(b".x.iii-0.tmp".as_slice()));
        // Past the grace everything goes.
        prune(&mut r, now + GRACE);
        assert!(r.names.is_empty());
    }
}
