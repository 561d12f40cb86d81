//! Shared-memory regions (an anonymous `memfd`, mapped by both processes) and the futex
//! waits on their sequence words. A caller spins first and sleeps only if the answer is
//! slow, so a call whose other side is awake costs no system call.

use std::os::fd::{AsFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use nix::sys::mman::{mmap, munmap, MapFlags, ProtFlags};

/// A shared mapping of a memfd.
pub struct Region {
    base: NonNull<u8>,
    len: usize,
    fd: OwnedFd,
}

// SAFETY: the mapping is plain shared memory; who may write it when is decided by the
// sequence words of the call laid out in it (`SharedCall`).
unsafe impl Send for Region {}
// SAFETY: as for Send; `&Region` hands out only the base pointer and the fd.
unsafe impl Sync for Region {}

impl Region {
    /// A new zero-filled region of `len` bytes (only pages written become resident).
    pub fn create(name: &str, len: usize) -> std::io::Result<Region> {
        let fd = nix::sys::memfd::memfd_create(name, nix::sys::memfd::MFdFlags::MFD_CLOEXEC)?;
        nix::unistd::ftruncate(&fd, len as libc::off_t)?;
        Region::map(fd)
    }

    /// Maps a region whose fd came from the other process.
    pub fn map(fd: OwnedFd) -> std::io::Result<Region> {
        let len = nix::sys::stat::fstat(fd.as_fd())?.st_size as usize;
        let length = std::num::NonZeroUsize::new(len)
            .ok_or_else(|| std::io::Error::other("an empty shared-memory region"))?;
        // SAFETY: a fresh shared mapping of the whole file; nothing else is mapped there.
        let base = unsafe {
            mmap(
                None,
                length,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED,
                &fd,
                0,
            )
        }?;
        Ok(Region {
            base: base.cast(),
            len,
            fd,
        })
    }

    pub fn base(&self) -> NonNull<u8> {
        self.base
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`; whoever used it holds the Region.
        let _ = unsafe { munmap(self.base.cast(), self.len) };
    }
}

fn futex_wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) {
    let spec = timeout.map(|t| libc::timespec {
        tv_sec: t.as_secs() as libc::time_t,
        tv_nsec: t.subsec_nanos() as libc::c_long,
    });
    // SAFETY: FUTEX_WAIT on a live, aligned u32 (shared, so not FUTEX_PRIVATE); the
    // timeout outlives the call. Spurious returns are handled by every caller's loop.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            spec.as_ref()
                .map_or(std::ptr::null(), |s| s as *const libc::timespec),
        );
    }
}

/// Wakes every process sleeping on `word`.
pub fn futex_wake(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE on a live, aligned u32.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX);
    }
}

/// Posts `value` to `word` and wakes the other side if it said it sleeps (`waiting`).
pub fn post(word: &AtomicU32, waiting: &AtomicU32, value: u32) {
    word.store(value, Ordering::SeqCst);
    // SeqCst pairs with `wait_for`: either the sleeper sees the new value before it
    // sleeps, or this load sees that it sleeps.
    if waiting.load(Ordering::SeqCst) != 0 {
        futex_wake(word);
    }
}

/// Waits until `word` differs from `old`, spinning for `spin` first; gives up at
/// `deadline`. Returns the new value, or None past the deadline.
pub fn wait_for(
    word: &AtomicU32,
    waiting: &AtomicU32,
    old: u32,
    spin: Duration,
    deadline: Option<Instant>,
) -> Option<u32> {
    let start = Instant::now();
    let mut spins = 0u32;
    loop {
        let now = word.load(Ordering::Acquire);
        if now != old {
            return Some(now);
        }
        spins += 1;
        if !spins.is_multiple_of(64) {
            std::hint::spin_loop();
            continue;
        }
        let now_t = Instant::now();
        if deadline.is_some_and(|d| now_t >= d) {
            return None;
        }
        if now_t.duration_since(start) < spin {
            std::thread::yield_now();
            continue;
        }
        waiting.store(1, Ordering::SeqCst);
        if word.load(Ordering::SeqCst) == old {
            futex_wait(
                word,
                old,
                deadline.map(|d| d.saturating_duration_since(now_t)),
            );
        }
        waiting.store(0, Ordering::SeqCst);
    }
}
