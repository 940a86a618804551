//! The kernel's Landlock ABI. The command ruleset is planned in [`crate::landlock_plan`] and
//! built in [`crate::landlock_ruleset`] (the executor gathers their inputs from its live
//! jail); the broker builds its own, for its few readable files.

/// The kernel's Landlock ABI version (0 when Landlock is unavailable or disabled).
pub fn kernel_abi() -> i32 {
    // SAFETY: landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION) only returns
    // a number; no memory is passed.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            1u32,
        )
    };
    if v < 0 {
        0
    } else {
        v as i32
    }
}
