//! Stacks for the children that start in the executor's memory (`CLONE_VM`): an anonymous
//! mapping of their own, not a heap allocation.
//!
//! A child runs on its stack while it shares the executor's memory, so whatever the stack is
//! made of stays in the executor's resident set. Taken from the heap (`vec![0; 64 KiB]`), each
//! stack is 64 KiB the allocator zeroes — every page touched — and, for a pre-started process,
//! held until that process is reaped: 200 concurrent calls left the executor's heap 13 MB
//! larger, and the allocator kept those pages after they were freed (the heap's top was
//! pinned by live allocations). A mapping is touched only where the child actually writes
//! (a page or two of a 64 KiB stack), and `munmap` hands all of it back on drop. A guard page
//! below each stack makes an overflow fault instead of writing into the next mapping.

use std::ptr::NonNull;

/// An anonymous, private read-write mapping used as a child's stack, with an inaccessible
/// guard page below it (an overflow faults instead of writing into the next mapping);
/// unmapped on drop.
pub struct Stack {
    /// The start of the whole mapping (the guard page).
    map: NonNull<u8>,
    /// The guard page's size.
    guard: usize,
    /// The usable size, above the guard.
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value; moving the owner to another
// thread moves nothing else.
unsafe impl Send for Stack {}
// SAFETY: a shared reference only hands out the address and the length.
unsafe impl Sync for Stack {}

fn page_size() -> usize {
    // SAFETY: sysconf reads a constant of the system.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(p).ok().filter(|p| *p > 0).unwrap_or(4096)
}

impl Stack {
    /// A usable mapping of `len` bytes (rounded up to pages by the kernel) above a guard
    /// page, untouched.
    pub fn new(len: usize) -> std::io::Result<Stack> {
        let guard = page_size();
        let total = len
            .checked_add(guard)
            .ok_or_else(|| std::io::Error::from_raw_os_error(libc::ENOMEM))?;
        // SAFETY: a fresh anonymous mapping at an address the kernel chooses; no existing
        // memory is affected.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                total,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let Some(map) = NonNull::new(p.cast::<u8>()) else {
            return Err(std::io::Error::from_raw_os_error(libc::ENOMEM));
        };
        let stack = Stack { map, guard, len };
        // SAFETY: the first page of the mapping just made, which nothing uses.
        if unsafe { libc::mprotect(p, guard, libc::PROT_NONE) } != 0 {
            // Dropping `stack` unmaps it.
            return Err(std::io::Error::last_os_error());
        }
        Ok(stack)
    }

    /// The lowest usable address (just above the guard page).
    pub fn base(&self) -> *mut u8 {
        // SAFETY: `guard` bytes into the mapping, which is `guard + len` long.
        unsafe { self.map.as_ptr().add(self.guard) }
    }

    /// The highest 16-byte-aligned address at least `reserve` bytes below the mapping's end:
    /// where a downward-growing stack starts.
    pub fn top(&self, reserve: usize) -> usize {
        (self.base() as usize + self.len - reserve) & !15
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping `new` made (guard included), which nothing uses
        // any more (the owner keeps a stack until the child that ran on it has exec'd, exited
        // or been reaped, and forgets it otherwise).
        unsafe {
            libc::munmap(self.map.as_ptr().cast(), self.guard + self.len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stack_is_writable_aligned_and_untouched_until_written() {
        let s = Stack::new(64 * 1024).unwrap();
        assert_eq!(s.len(), 64 * 1024);
        let top = s.top(64);
        assert_eq!(top % 16, 0);
        assert_eq!(top, s.base() as usize + 64 * 1024 - 64);
        // SAFETY: inside the mapping, which is ours and writable.
        unsafe {
            *s.base() = 1;
            *((top - 1) as *mut u8) = 2;
            assert_eq!(*s.base(), 1);
        }
        // Only the two written pages are resident.
        let mut vec = [0u8; 16];
        // SAFETY: mincore writes one byte per page of the 16-page mapping into `vec`.
        let r = unsafe { libc::mincore(s.base().cast(), s.len(), vec.as_mut_ptr()) };
        assert_eq!(r, 0);
        let resident = vec.iter().filter(|b| *b & 1 == 1).count();
        assert_eq!(resident, 2, "{vec:?}");
    }

    #[test]
    fn below_the_stack_is_a_guard_page() {
        let s = Stack::new(64 * 1024).unwrap();
        let guard = (s.base() as usize - page_size()) as *mut libc::c_void;
        // The page below the base is mapped but inaccessible: mincore sees it, and an
        // mprotect probe finds no access to it (reading it would fault).
        let mut v = [0u8; 1];
        // SAFETY: mincore on the guard page of our own mapping.
        assert_eq!(
            unsafe { libc::mincore(guard, page_size(), v.as_mut_ptr()) },
            0
        );
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let start = format!("{:x}-", guard as usize);
        let line = maps
            .lines()
            .find(|l| l.starts_with(&start))
            .unwrap_or_else(|| panic!("no mapping starts at {start}:\n{maps}"));
        assert!(line.contains(" ---p "), "{line}");
    }
}
