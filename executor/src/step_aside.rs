//! Giving the CPU to a process we have just woken.
//!
//! A write to a Unix socket wakes the reader with a *sync* wake-up: the kernel takes it as a
//! promise that the writer is about to sleep, and often queues the reader on the writer's
//! CPU rather than on an idle one. The executor breaks that promise at two points of every
//! `shell::exec`: right after handing a command to a pre-started process (it still has to
//! start watching the command's pipes and pidfd), and right after writing the reply (the
//! command's descriptors are released and the next process is pre-started, about 150 µs).
//! Whether the woken process preempts us then depends on the scheduler's bookkeeping; when it
//! does not, it waits for all of that work. Traced on a 2-vCPU guest, a third of replies
//! waited a median 173 µs for the executor's clean-up, and most hand-overs 25 µs.
//!
//! Stepping aside (`sched_yield`) lets it run first: the command starts at once, and the
//! broker reads its reply at once. When nothing else is runnable on this CPU the call returns
//! at once. On a loaded host the executor's own next step may wait for other processes'
//! turns; what it defers there (watching pipes that buffer 64 KiB, releasing descriptors)
//! is not on the caller's path.

/// Lets another runnable process on this CPU run before we go on.
pub fn step_aside() {
    // SAFETY: sched_yield takes no arguments and has no memory effects.
    unsafe {
        libc::sched_yield();
    }
}
