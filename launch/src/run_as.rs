//! The user commands act as (`confinement.run_as`), and the executor's switch to it.
//!
//! The decision is a pure function ([`decide`]) of the worker's uid, whether it is jailed,
//! the configured `run_as` (already resolved to ids) and the owner of the primary root. The
//! executor applies it to *itself* once, when its first policy arrives ([`RunAs::apply`]): its
//! root-only set-up (capability drop, seccomp, job cgroup base) is done by then, so from that
//! moment fs operations and commands act as the same unprivileged user and file permissions
//! are one more layer. A later policy that resolves to another user is refused (restart the
//! worker to change it).

use std::sync::Mutex;

use iii_shell_policy::sync::lock;
use iii_shell_protocol::config::{Config, ConfinementMode, RunAs as RunAsConfig};

use crate::cgroups::JobCgroups;
use crate::privileges::{Kernel, Privileges};

/// `nobody`: what commands run as in a jail whose primary root is owned by root.
pub const NOBODY: u32 = 65534;

/// The user commands run as, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub uid: u32,
    pub gid: u32,
    /// Why this user (for logs and doctor).
    pub why: String,
    /// A warning to log once at start-up and show in doctor.
    pub warning: Option<String>,
}

/// What [`decide`] needs to know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Facts {
    /// The executor's uid and gid before any switch.
    pub worker: (u32, u32),
    pub jailed: bool,
    pub strict: bool,
    /// `confinement.run_as`, resolved to a uid and gid.
    pub run_as: Option<(u32, u32)>,
    /// The owner (uid, and that user's primary gid or the root's gid) of the primary root.
    pub primary_owner: Option<(u32, u32)>,
    /// The primary root, for messages.
    pub primary_root: String,
}

/// The policy decision: which uid and gid commands act as.
pub fn decide(f: &Facts) -> Result<Decision, String> {
    let (wuid, wgid) = f.worker;
    if wuid != 0 {
        return Ok(Decision {
            uid: wuid,
            gid: wgid,
            why: "the worker is not root: commands run as its own user".into(),
            warning: None,
        });
    }
    if !f.jailed {
        return Ok(match f.run_as {
            Some((uid, gid)) => Decision {
                uid,
                gid,
                why: "confinement.run_as (unjailed)".into(),
                warning: None,
            },
            None => Decision {
                uid: 0,
                gid: 0,
                why: "unjailed (fs.allow_unjailed: true) and confinement.run_as unset: commands run as root, as the operator chose".into(),
                warning: None,
            },
        });
    }
    match (f.run_as, f.primary_owner) {
        (Some((0, gid)), _) => {
            let msg = "confinement.run_as is root in a jail: commands can change the mode, owner and times of any root-owned file they can name (Landlock does not govern those); set confinement.run_as to an unprivileged user";
            if f.strict {
                return Err(format!("strict mode refuses to start: {msg}"));
            }
            Ok(Decision {
                uid: 0,
                gid,
                why: "confinement.run_as: root (explicit)".into(),
                warning: Some(msg.into()),
            })
        }
        (Some((uid, gid)), _) => Ok(Decision {
            uid,
            gid,
            why: "confinement.run_as".into(),
            warning: None,
        }),
        (None, Some((uid, gid))) if uid != 0 => Ok(Decision {
            uid,
            gid,
            why: format!(
                "confinement.run_as unset: the owner of the primary root {}",
                f.primary_root
            ),
            warning: None,
        }),
        (None, _) => {
            let msg = format!(
                "the primary root {} is owned by root and confinement.run_as is unset: commands run as nobody (65534:65534) and can read the jail but not write it; set confinement.run_as to the user commands should act as, or change the owner of {}",
                f.primary_root, f.primary_root
            );
            if f.strict {
                return Err(format!("strict mode refuses to start: {msg}"));
            }
            Ok(Decision {
                uid: NOBODY,
                gid: NOBODY,
                why: "confinement.run_as unset and a root-owned primary root: nobody".into(),
                warning: Some(msg),
            })
        }
    }
}

/// Resolves `confinement.run_as` to (uid, gid): a name through the user database, a bare uid
/// to that user's primary group when it has an entry (else gid = uid).
pub fn resolve(run_as: &str) -> Result<(u32, u32), String> {
    match RunAsConfig::parse(run_as)? {
        RunAsConfig::Id { uid, gid: Some(gid) } => Ok((uid, gid)),
        RunAsConfig::Id { uid, gid: None } => {
            let gid = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
                .ok()
                .flatten()
                .map_or(uid, |u| u.gid.as_raw());
            Ok((uid, gid))
        }
        RunAsConfig::Name(name) => match nix::unistd::User::from_name(&name) {
            Ok(Some(u)) => Ok((u.uid.as_raw(), u.gid.as_raw())),
            Ok(None) => Err(format!(
                "confinement.run_as: user {name:?} does not exist (give uid[:gid] or create the user)"
            )),
            Err(e) => Err(format!("confinement.run_as: cannot look up {name:?}: {e}")),
        },
    }
}

/// The supplementary groups of `uid`: its user's groups when it has a database entry
/// (always including `gid`), else just `gid`. Never the executor's own (root's) groups.
pub fn groups_of(uid: u32, gid: u32) -> Vec<u32> {
    let user = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
        .ok()
        .flatten();
    let mut out = match user.and_then(|u| std::ffi::CString::new(u.name).ok()) {
        Some(name) => nix::unistd::getgrouplist(&name, nix::unistd::Gid::from_raw(gid))
            .map(|g| g.into_iter().map(|g| g.as_raw()).collect())
            .unwrap_or_else(|_| vec![gid]),
        None => vec![gid],
    };
    out.sort_unstable();
    out.dedup();
    out
}

/// The facts for `config` in this process.
pub fn facts(config: &Config, worker: (u32, u32)) -> Result<Facts, String> {
    use std::os::unix::fs::MetadataExt;
    let run_as = config
        .confinement
        .run_as
        .as_deref()
        .map(resolve)
        .transpose()?;
    let primary = config.fs.host_roots.first().cloned();
    let primary_owner = match &primary {
        Some(p) => {
            let md = std::fs::metadata(p).map_err(|e| format!("primary root {p}: {e}"))?;
            let uid = md.uid();
            let gid = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
                .ok()
                .flatten()
                .map_or(md.gid(), |u| u.gid.as_raw());
            Some((uid, gid))
        }
        None => None,
    };
    Ok(Facts {
        worker,
        jailed: primary.is_some(),
        strict: config.confinement.mode == ConfinementMode::Strict,
        run_as,
        primary_owner,
        primary_root: primary.unwrap_or_default(),
    })
}

/// The decision for `config` as this process would make it (its own uid): `check-config`
/// and the supervisor's start-up check.
pub fn decide_here(config: &Config) -> Result<Decision, String> {
    // SAFETY: geteuid/getegid cannot fail.
    let worker = unsafe { (libc::geteuid(), libc::getegid()) };
    decide(&facts(config, worker)?)
}

/// Where this executor stands.
#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    /// Not a root executor that kept what a switch needs (tests, library use, non-root):
    /// commands run as this process's user, whatever the policy says.
    Unarmed,
    /// Root, holding CAP_SETUID, CAP_SETGID and CAP_CHOWN (effective and permitted only)
    /// until the first policy says which user to become.
    Armed,
    /// The first policy was applied: the executor (and every command) acts as this user.
    Settled(Applied),
}

/// The user applied, as read back from the kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
    pub why: String,
    pub warning: Option<String>,
}

/// A launcher's command user: where the switch to it stands, and the uid commands may never
/// run as (the executor socket's peer).
#[derive(Debug)]
pub struct RunAs {
    state: Mutex<State>,
    /// The uid allowed to connect to the executor's socket (`--socket --peer-uid`), if it
    /// has one.
    peer_uid: Mutex<Option<u32>>,
}

impl Default for RunAs {
    fn default() -> Self {
        RunAs {
            state: Mutex::new(State::Unarmed),
            peer_uid: Mutex::new(None),
        }
    }
}

/// What the executor says when commands run as the uid allowed on its socket.
pub const PEER_IS_COMMAND_UID: &str = "the executor socket's peer uid equals the uid commands run as, so a command could connect to it; run the broker as another user and pass --peer-uid";

/// The socket rule for commands acting as `uid`, when `peer` may connect to the executor
/// socket: another uid is fine; the same unprivileged uid is refused; root for both (a root
/// broker, commands as root) is refused in strict mode and otherwise a warning.
pub fn peer_check(
    peer: Option<u32>,
    uid: u32,
    why: &str,
    strict: bool,
) -> Result<Option<String>, String> {
    match peer {
        Some(peer) if peer == uid && peer != 0 => Err(format!(
            "commands would run as uid {peer} ({why}), the uid allowed to connect to the executor socket: a command could talk to the executor; set confinement.run_as to another user"
        )),
        Some(peer) if peer == uid && strict => {
            Err(format!("strict mode refuses this policy: {PEER_IS_COMMAND_UID}"))
        }
        Some(peer) if peer == uid => Ok(Some(PEER_IS_COMMAND_UID.to_string())),
        _ => Ok(None),
    }
}

/// Refuses a decision whose uid may connect to the executor socket (`peer`); the warning, if
/// any, for a root peer and root commands.
fn not_the_peer(
    peer: Option<u32>,
    d: Decision,
    strict: bool,
) -> Result<(Decision, Option<String>), String> {
    let w = peer_check(peer, d.uid, &d.why, strict)?;
    Ok((d, w))
}

/// The capabilities a root executor keeps (effective and permitted only, never bounding or
/// inheritable) until its first policy: the uid/gid switch and handing the job cgroup base
/// to the command user.
pub const RETAINED: [caps::Capability; 3] = [
    caps::Capability::CAP_SETUID,
    caps::Capability::CAP_SETGID,
    caps::Capability::CAP_CHOWN,
];

impl RunAs {
    /// Records the socket's peer uid: commands may never run as it (Landlock ABI <= 7 cannot
    /// stop a command from connecting to a socket file its uid may open).
    pub fn set_peer_uid(&self, uid: u32) {
        *lock(&self.peer_uid) = Some(uid);
    }

    /// Called by the executor's start-up (before any thread) when it is root and retained
    /// [`RETAINED`].
    pub fn arm(&self) {
        *lock(&self.state) = State::Armed;
    }

    /// What was applied, if anything (for doctor).
    pub fn applied(&self) -> Option<Applied> {
        match &*lock(&self.state) {
            State::Settled(a) => Some(a.clone()),
            _ => None,
        }
    }

    /// Applies the user `config` asks for: the first time, switches this process to it (or,
    /// for root, drops the retained capabilities), handing `cgroups` to that user; afterwards,
    /// refuses a config that resolves to another user. Unarmed, it only checks the decision
    /// can be made (strict refusals hold).
    pub fn apply(&self, config: &Config, cgroups: &JobCgroups) -> Result<(), String> {
        let peer = *lock(&self.peer_uid);
        let mut st = lock(&self.state);
        match &*st {
            State::Unarmed => {
                // SAFETY: getuid/getgid cannot fail.
                let worker = unsafe { (libc::getuid(), libc::getgid()) };
                decide(&facts(config, worker)?)?;
                Ok(())
            }
            State::Settled(a) => {
                let f = facts(config, (0, 0))?;
                let (d, _) = not_the_peer(peer, decide(&f)?, f.strict)?;
                if (d.uid, d.gid) != (a.uid, a.gid) {
                    return Err(format!(
                        "this policy runs commands as {}:{} ({}), but the executor already runs them as {}:{}; restart the worker to change the command user",
                        d.uid, d.gid, d.why, a.uid, a.gid
                    ));
                }
                Ok(())
            }
            State::Armed => {
                let f = facts(config, (0, 0))?;
                let (d, peer_warning) = not_the_peer(peer, decide(&f)?, f.strict)?;
                let groups = if d.uid == 0 {
                    Vec::new()
                } else {
                    groups_of(d.uid, d.gid)
                };
                switch(&d, &groups, cgroups)?;
                tracing::info!(uid = d.uid, gid = d.gid, groups = ?groups, why = %d.why, "commands act as this user");
                // Said once, now that it is known to hold: the command user never changes after.
                for w in d.warning.iter().chain(&peer_warning) {
                    tracing::warn!("{w}");
                }
                *st = State::Settled(Applied {
                    uid: d.uid,
                    gid: d.gid,
                    groups,
                    why: d.why,
                    warning: d.warning,
                });
                Ok(())
            }
        }
    }
}

fn switch(d: &Decision, groups: &[u32], cgroups: &JobCgroups) -> Result<(), String> {
    if d.uid != 0 {
        // Before the switch: handing the cgroup base over needs CAP_CHOWN.
        cgroups.hand_to(d.uid, d.gid);
    }
    become_user(&Kernel, d, groups)
}

/// The switch itself on `p`: root keeps root but drops the retained capabilities the
/// envelope does not keep; any other user gets its groups, gid, then uid, and must be left
/// with no capability. Stops at the first step that fails.
fn become_user<P: Privileges>(p: &P, d: &Decision, groups: &[u32]) -> Result<(), String> {
    if d.uid == 0 {
        // Staying root: the retained capabilities must go from every thread, and capset only
        // reaches the calling one.
        let threads = p.threads();
        if threads != 1 {
            return Err(format!(
                "commands would run as root, but the retained set-up capabilities cannot be dropped on {threads} threads; run the executor with III_SHELL_EXECUTOR_THREADS=1 or set confinement.run_as to an unprivileged user"
            ));
        }
        // Those the envelope keeps (`confinement.capabilities`) are in the bounding set,
        // which was reduced to exactly that list: they stay.
        for c in RETAINED.into_iter().filter(|c| !p.in_bounding(*c)) {
            p.drop_capability(c).map_err(|e| format!("drop {c}: {e}"))?;
        }
        return Ok(());
    }
    // glibc applies each of these to every thread of the process. Leaving uid 0 in all three
    // ids clears the permitted and effective sets (no SECBIT_KEEP_CAPS), so the retained
    // capabilities go with it.
    p.setgroups(groups).map_err(|e| format!("setgroups: {e}"))?;
    p.setresgid(d.gid)
        .map_err(|e| format!("setresgid({}): {e}", d.gid))?;
    p.setresuid(d.uid)
        .map_err(|e| format!("setresuid({}): {e}", d.uid))?;
    let left = p.capabilities_left();
    if !left.is_empty() {
        return Err(format!("capabilities survived the uid switch: {left:?}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(
        worker: (u32, u32),
        jailed: bool,
        run_as: Option<(u32, u32)>,
        owner: Option<(u32, u32)>,
    ) -> Facts {
        Facts {
            worker,
            jailed,
            strict: false,
            run_as,
            primary_owner: owner,
            primary_root: "/srv/w".into(),
        }
    }

    fn ids(d: Result<Decision, String>) -> (u32, u32, bool) {
        let d = d.unwrap();
        (d.uid, d.gid, d.warning.is_some())
    }

    #[test]
    fn a_non_root_worker_runs_commands_as_itself() {
        assert_eq!(
            ids(decide(&f((1000, 100), true, Some((0, 0)), Some((0, 0))))),
            (1000, 100, false)
        );
        assert_eq!(
            ids(decide(&f((1000, 100), false, None, None))),
            (1000, 100, false)
        );
    }

    #[test]
    fn root_unjailed_runs_as_root_unless_run_as_says_otherwise() {
        assert_eq!(ids(decide(&f((0, 0), false, None, None))), (0, 0, false));
        assert_eq!(
            ids(decide(&f((0, 0), false, Some((1000, 1000)), None))),
            (1000, 1000, false)
        );
    }

    #[test]
    fn root_jailed_takes_run_as_then_the_owner_of_the_primary_root() {
        assert_eq!(
            ids(decide(&f(
                (0, 0),
                true,
                Some((1001, 1002)),
                Some((1000, 1000))
            ))),
            (1001, 1002, false)
        );
        assert_eq!(
            ids(decide(&f((0, 0), true, None, Some((1000, 1003))))),
            (1000, 1003, false)
        );
    }

    #[test]
    fn a_root_owned_primary_root_gives_nobody_with_a_warning_naming_the_fix() {
        let d = decide(&f((0, 0), true, None, Some((0, 0)))).unwrap();
        assert_eq!((d.uid, d.gid), (65534, 65534));
        let w = d.warning.unwrap();
        assert!(w.contains("set confinement.run_as"), "{w}");
        assert!(w.contains("change the owner of /srv/w"), "{w}");
        let mut strict = f((0, 0), true, None, Some((0, 0)));
        strict.strict = true;
        let e = decide(&strict).unwrap_err();
        assert!(e.starts_with("strict mode refuses to start"), "{e}");
    }

    #[test]
    fn explicit_root_in_a_jail_warns_and_strict_refuses() {
        let d = decide(&f((0, 0), true, Some((0, 0)), Some((1000, 1000)))).unwrap();
        assert_eq!((d.uid, d.gid), (0, 0));
        assert!(d.warning.unwrap().contains("run_as is root"));
        let mut strict = f((0, 0), true, Some((0, 0)), Some((1000, 1000)));
        strict.strict = true;
        assert!(decide(&strict)
            .unwrap_err()
            .starts_with("strict mode refuses"));
    }

    #[test]
    fn the_socket_peer_rule_exact_values() {
        assert_eq!(peer_check(None, 0, "w", true), Ok(None));
        assert_eq!(peer_check(Some(995), 4242, "w", true), Ok(None));
        assert_eq!(
            peer_check(Some(0), 4242, "w", true),
            Ok(None),
            "a root broker, commands as a user"
        );
        assert_eq!(
            peer_check(Some(4242), 4242, "confinement.run_as", false),
            Err("commands would run as uid 4242 (confinement.run_as), the uid allowed to connect to the executor socket: a command could talk to the executor; set confinement.run_as to another user".into())
        );
        assert_eq!(
            peer_check(Some(0), 0, "w", false),
            Ok(Some("the executor socket's peer uid equals the uid commands run as, so a command could connect to it; run the broker as another user and pass --peer-uid".into()))
        );
        assert_eq!(
            peer_check(Some(0), 0, "w", true),
            Err("strict mode refuses this policy: the executor socket's peer uid equals the uid commands run as, so a command could connect to it; run the broker as another user and pass --peer-uid".into())
        );
    }

    #[test]
    fn run_as_resolves_names_and_ids() {
        assert_eq!(resolve("0:0"), Ok((0, 0)));
        assert_eq!(resolve("4242:4343"), Ok((4242, 4343)));
        // No user database entry: gid = uid.
        assert_eq!(resolve("4242"), Ok((4242, 4242)));
        assert_eq!(resolve("root"), Ok((0, 0)));
        assert!(resolve("no-such-user-iii")
            .unwrap_err()
            .contains("does not exist"));
        assert_eq!(groups_of(4242, 4343), vec![4343]);
    }

    fn user(uid: u32, gid: u32) -> Decision {
        Decision {
            uid,
            gid,
            why: "confinement.run_as".into(),
            warning: None,
        }
    }

    use crate::privileges::fake::{Call, Recorder};
    use caps::Capability::{CAP_CHOWN, CAP_SETGID, CAP_SETUID};

    #[test]
    fn the_switch_sets_groups_then_gid_then_uid_then_checks_no_capability_is_left() {
        let p = Recorder::default();
        assert_eq!(become_user(&p, &user(1000, 100), &[27, 100]), Ok(()));
        assert_eq!(
            p.calls(),
            vec![
                Call::Setgroups(vec![27, 100]),
                Call::Setresgid(100),
                Call::Setresuid(1000),
                Call::CapabilitiesLeft,
            ]
        );
    }

    #[test]
    fn a_failed_switch_step_stops_the_switch_with_its_error() {
        let full = [
            Call::Setgroups(vec![100]),
            Call::Setresgid(100),
            Call::Setresuid(1000),
        ];
        let errors = [
            "setgroups: Operation not permitted (os error 1)",
            "setresgid(100): Operation not permitted (os error 1)",
            "setresuid(1000): Operation not permitted (os error 1)",
        ];
        for n in 0..full.len() {
            let p = Recorder::failing_at(n, libc::EPERM);
            assert_eq!(
                become_user(&p, &user(1000, 100), &[100]),
                Err(errors[n].to_string())
            );
            assert_eq!(p.calls(), full[..=n].to_vec());
        }
    }

    #[test]
    fn capabilities_that_survive_the_switch_are_an_error() {
        let p = Recorder {
            left: vec!["CAP_SETUID".into()],
            ..Recorder::default()
        };
        assert_eq!(
            become_user(&p, &user(1000, 100), &[100]),
            Err("capabilities survived the uid switch: [\"CAP_SETUID\"]".to_string())
        );
    }

    #[test]
    fn staying_root_drops_the_retained_capabilities_the_envelope_does_not_keep() {
        let p = Recorder {
            bounding: vec![CAP_CHOWN],
            ..Recorder::default()
        };
        assert_eq!(become_user(&p, &user(0, 0), &[]), Ok(()));
        assert_eq!(
            p.calls(),
            vec![
                Call::Threads,
                Call::InBounding(CAP_SETUID),
                Call::DropCapability(CAP_SETUID),
                Call::InBounding(CAP_SETGID),
                Call::DropCapability(CAP_SETGID),
                Call::InBounding(CAP_CHOWN),
            ]
        );
        // A failed drop stops there.
        let mut p = Recorder::failing_at(2, libc::EPERM);
        p.bounding = vec![CAP_CHOWN];
        assert_eq!(
            become_user(&p, &user(0, 0), &[]),
            Err("drop CAP_SETUID: Operation not permitted (os error 1)".to_string())
        );
        assert_eq!(p.calls().len(), 3);
    }

    #[test]
    fn staying_root_on_several_threads_is_refused_before_any_drop() {
        let p = Recorder {
            threads: 2,
            ..Recorder::default()
        };
        let e = become_user(&p, &user(0, 0), &[]).unwrap_err();
        assert!(e.starts_with("commands would run as root, but the retained set-up capabilities cannot be dropped on 2 threads"), "{e}");
        assert_eq!(p.calls(), vec![Call::Threads]);
    }
}
