//! Capabilities: drop every set to the configured ones, then read them back to verify.

use std::collections::HashSet;

use caps::{CapSet, Capability, CapsHashSet};

pub fn parse(names: &[String]) -> Result<CapsHashSet, String> {
    let mut out = HashSet::new();
    for n in names {
        let name = if n.to_ascii_uppercase().starts_with("CAP_") {
            n.to_ascii_uppercase()
        } else {
            format!("CAP_{}", n.to_ascii_uppercase())
        };
        let c: Capability = name
            .parse()
            .map_err(|_| format!("unknown capability {n:?}"))?;
        out.insert(c);
    }
    Ok(out)
}

/// The five capability sets of this thread.
#[derive(Debug, Clone, Default)]
pub struct CapState {
    pub effective: Vec<String>,
    pub permitted: Vec<String>,
    pub inheritable: Vec<String>,
    pub bounding: Vec<String>,
    pub ambient: Vec<String>,
}

fn names(set: CapsHashSet) -> Vec<String> {
    let mut v: Vec<String> = set.into_iter().map(|c| c.to_string()).collect();
    v.sort();
    v
}

pub fn read() -> CapState {
    let r = |s| caps::read(None, s).map(names).unwrap_or_default();
    CapState {
        effective: r(CapSet::Effective),
        permitted: r(CapSet::Permitted),
        inheritable: r(CapSet::Inheritable),
        bounding: r(CapSet::Bounding),
        ambient: r(CapSet::Ambient),
    }
}

/// Drops bounding, ambient, inheritable, permitted and effective to `keep`, then verifies by
/// re-reading every set. Returns the state read back.
pub fn drop_to(keep: &CapsHashSet) -> Result<CapState, String> {
    drop_to_retaining(keep, &CapsHashSet::new())
}

/// [`drop_to`], but `retain` stays in the effective and permitted sets only (never bounding,
/// inheritable or ambient, so no command can get it across execve): what the executor needs
/// until its first policy says which user to become (see `run_as`).
pub fn drop_to_retaining(keep: &CapsHashSet, retain: &CapsHashSet) -> Result<CapState, String> {
    // The bounding set needs CAP_SETPCAP to shrink: do it first, while we may still have it.
    // An unprivileged process cannot shrink it at all; with nothing permitted and
    // no_new_privs set, it can never gain anything from it either, so it is left as is.
    let privileged =
        caps::has_cap(None, CapSet::Effective, Capability::CAP_SETPCAP).unwrap_or(false);
    for c in caps::all().into_iter().filter(|_| privileged) {
        if !keep.contains(&c) && caps::has_cap(None, CapSet::Bounding, c).unwrap_or(false) {
            caps::drop(None, CapSet::Bounding, c)
                .map_err(|e| format!("drop {c} from the bounding set: {e}"))?;
        }
    }
    caps::clear(None, CapSet::Ambient).map_err(|e| format!("clear the ambient set: {e}"))?;
    let inh: CapsHashSet = keep
        .iter()
        .copied()
        .filter(|c| caps::has_cap(None, CapSet::Permitted, *c).unwrap_or(false))
        .collect();
    caps::set(None, CapSet::Inheritable, &inh)
        .map_err(|e| format!("set the inheritable set: {e}"))?;
    let held: CapsHashSet = inh
        .iter()
        .copied()
        .chain(
            retain
                .iter()
                .copied()
                .filter(|c| caps::has_cap(None, CapSet::Permitted, *c).unwrap_or(false)),
        )
        .collect();
    caps::set(None, CapSet::Effective, &held).map_err(|e| format!("set the effective set: {e}"))?;
    caps::set(None, CapSet::Permitted, &held).map_err(|e| format!("set the permitted set: {e}"))?;
    let state = read();
    let want = names(keep.clone());
    let want_held = names(keep.iter().chain(retain.iter()).copied().collect());
    let mut checked = vec![
        ("effective", &state.effective, &want_held),
        ("permitted", &state.permitted, &want_held),
    ];
    if privileged {
        checked.push(("bounding", &state.bounding, &want));
    }
    for (set, have, want) in checked {
        if have.iter().any(|c| !want.contains(c)) {
            return Err(format!(
                "verification failed: the {set} set still holds {have:?}"
            ));
        }
    }
    if !state.ambient.is_empty() {
        return Err(format!(
            "verification failed: the ambient set still holds {:?}",
            state.ambient
        ));
    }
    Ok(state)
}
