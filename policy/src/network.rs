//! The network modes in order, and a call's tightening of its own.
//!
//! The modes form one total order, from widest to tightest:
//! `allow` < `deny_bind` < `loopback` < `deny`. `loopback` is tighter than `deny_bind`
//! although it lets a command bind: it binds inside a network namespace of its own, which
//! nothing outside it can reach, and it can connect to nothing beyond that namespace's
//! loopback, where `deny_bind` still connects anywhere. So every mode reaches a subset of
//! what the modes before it reach, and a call may always ask for any mode after the one
//! configured.

use crate::config::NetworkAccess;

/// The position of a mode in the order (0 is the widest).
pub fn tightness(a: NetworkAccess) -> u8 {
    match a {
        NetworkAccess::Allow => 0,
        NetworkAccess::DenyBind => 1,
        NetworkAccess::Loopback => 2,
        NetworkAccess::Deny => 3,
    }
}

/// Whether `new` reaches more than `base`.
pub fn wider(new: NetworkAccess, base: NetworkAccess) -> bool {
    tightness(new) < tightness(base)
}

/// What a call runs under: the configured mode, or the call's own `network` when that is
/// at least as tight. A wider one is refused with the message the caller sees (S210).
pub fn for_call(
    configured: NetworkAccess,
    requested: Option<NetworkAccess>,
) -> Result<NetworkAccess, String> {
    match requested {
        None => Ok(configured),
        Some(r) if wider(r, configured) => Err(format!(
            "network {} is wider than the configured confinement.network {}: a call may only tighten it",
            name(r),
            name(configured)
        )),
        Some(r) => Ok(r),
    }
}

/// What a command wanting `wanted` (under the policy's `configured`) runs under, and, when
/// that is not `wanted`, what is missing to enforce it. Never wider: what cannot be enforced
/// runs as `deny` (the socket-family rule needs only seccomp, which every kernel here has).
/// `loopback` is whether a network namespace of its own can be given to a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Enforced {
    pub runs_as: NetworkAccess,
    pub missing: Option<&'static str>,
}

/// What is missing for a per-call `deny_bind` under `allow`.
pub const NO_CALL_DENY_BIND: &str = "a per-call deny_bind: the policy's Landlock ruleset has no TCP rule to add (configure confinement.network: deny_bind)";
/// What is missing for `loopback`.
pub const NO_LOOPBACK: &str =
    "loopback: a network namespace of its own for the command (CAP_SYS_ADMIN in the executor)";

/// See [`Enforced`].
pub fn enforce(configured: NetworkAccess, wanted: NetworkAccess, loopback: bool) -> Enforced {
    use NetworkAccess::*;
    let ok = |runs_as| Enforced {
        runs_as,
        missing: None,
    };
    let tighter = |missing| Enforced {
        runs_as: Deny,
        missing: Some(missing),
    };
    match wanted {
        Allow | Deny => ok(wanted),
        DenyBind if configured == DenyBind => ok(DenyBind),
        DenyBind => tighter(NO_CALL_DENY_BIND),
        Loopback if loopback => ok(Loopback),
        Loopback => tighter(NO_LOOPBACK),
    }
}

/// The mode as the configuration spells it.
pub fn name(a: NetworkAccess) -> &'static str {
    match a {
        NetworkAccess::Allow => "allow",
        NetworkAccess::DenyBind => "deny_bind",
        NetworkAccess::Loopback => "loopback",
        NetworkAccess::Deny => "deny",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use NetworkAccess::*;

    const ALL: [NetworkAccess; 4] = [Allow, DenyBind, Loopback, Deny];

    #[test]
    fn order_exact() {
        assert_eq!(ALL.map(tightness), [0, 1, 2, 3]);
        assert!(wider(Allow, DenyBind));
        assert!(wider(DenyBind, Loopback));
        assert!(wider(Loopback, Deny));
        assert!(!wider(Deny, Loopback));
        assert!(!wider(Loopback, Loopback));
    }

    #[test]
    fn for_call_exact() {
        // Every pair (configured, requested): allowed exactly when requested is not wider.
        let mut allowed = Vec::new();
        for c in ALL {
            for r in ALL {
                if let Ok(got) = for_call(c, Some(r)) {
                    assert_eq!(got, r);
                    allowed.push((name(c), name(r)));
                }
            }
            assert_eq!(for_call(c, None), Ok(c));
        }
        assert_eq!(
            allowed,
            [
                ("allow", "allow"),
                ("allow", "deny_bind"),
                ("allow", "loopback"),
                ("allow", "deny"),
                ("deny_bind", "deny_bind"),
                ("deny_bind", "loopback"),
                ("deny_bind", "deny"),
                ("loopback", "loopback"),
                ("loopback", "deny"),
                ("deny", "deny"),
            ]
        );
        assert_eq!(
            for_call(Deny, Some(Allow)),
            Err("network allow is wider than the configured confinement.network deny: a call may only tighten it".into())
        );
    }

    #[test]
    fn enforce_exact() {
        let runs = |c, w, l| {
            let e = enforce(c, w, l);
            (name(e.runs_as), e.missing)
        };
        assert_eq!(runs(Allow, Allow, false), ("allow", None));
        assert_eq!(runs(Allow, Deny, false), ("deny", None));
        assert_eq!(runs(Deny, Deny, true), ("deny", None));
        assert_eq!(runs(DenyBind, DenyBind, false), ("deny_bind", None));
        assert_eq!(
            runs(Allow, DenyBind, true),
            ("deny", Some(NO_CALL_DENY_BIND))
        );
        assert_eq!(runs(Allow, Loopback, true), ("loopback", None));
        assert_eq!(runs(Loopback, Loopback, true), ("loopback", None));
        assert_eq!(runs(Loopback, Loopback, false), ("deny", Some(NO_LOOPBACK)));
        assert_eq!(runs(DenyBind, Loopback, false), ("deny", Some(NO_LOOPBACK)));
    }

    #[test]
    fn names_round_trip_through_serde() {
        for a in ALL {
            assert_eq!(serde_json::to_value(a).unwrap(), serde_json::json!(name(a)));
        }
    }
}
