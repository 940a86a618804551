//! What the executor itself may do about ownership, read once per operation: the chown and
//! chmod checks of `ops` and the owner a rewrite keeps (`keep`) both decide from it.

/// What the executor itself may do about ownership: its ids, its groups and `CAP_CHOWN`.
pub struct OwnerRights {
    pub euid: u32,
    pub egid: u32,
    pub groups: Vec<u32>,
    pub cap_chown: bool,
}

impl OwnerRights {
    /// The policy's view of these rights.
    pub fn writer(&self) -> iii_shell_policy::mode::Writer<'_> {
        iii_shell_policy::mode::Writer {
            euid: self.euid,
            egid: self.egid,
            groups: &self.groups,
            cap_chown: self.cap_chown,
        }
    }

    pub fn current() -> OwnerRights {
        OwnerRights {
            euid: nix::unistd::geteuid().as_raw(),
            egid: nix::unistd::getegid().as_raw(),
            groups: nix::unistd::getgroups()
                .map(|g| g.into_iter().map(|g| g.as_raw()).collect())
                .unwrap_or_default(),
            cap_chown: caps::has_cap(None, caps::CapSet::Effective, caps::Capability::CAP_CHOWN)
                .unwrap_or(false),
        }
    }
}
