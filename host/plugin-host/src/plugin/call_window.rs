//! The registrar and the builder a plugin receives are valid only during the call that
//! hands them over. A plugin that keeps the pointer and calls back later must be refused,
//! not let read freed stack memory: the host's callback structs and this window live for
//! the rest of the process (a few dozen bytes per registration or build), and the window
//! is closed when the call returns.

use std::ffi::c_void;

use parking_lot::Mutex;

/// The host context of one registrar or builder call, or nothing once it returned.
pub(super) struct CallWindow {
    context: Mutex<*mut c_void>,
}

// SAFETY: the pointer is only dereferenced under the mutex, while the call that owns the
// context is in progress (the window is closed before that call returns).
unsafe impl Send for CallWindow {}
// SAFETY: as for Send.
unsafe impl Sync for CallWindow {}

impl CallWindow {
    /// A window onto `context`, open until [`CallWindow::close`], never freed.
    pub(super) fn open<T>(context: &mut T) -> &'static CallWindow {
        Box::leak(Box::new(CallWindow {
            context: Mutex::new(std::ptr::from_mut(context).cast()),
        }))
    }

    /// Refuses every later call; waits for one in progress on another thread.
    pub(super) fn close(&self) {
        *self.context.lock() = std::ptr::null_mut();
    }

    /// Runs `f` on the context while the window is open; `None` once it is closed.
    ///
    /// # Safety
    /// `T` must be the type the window was opened with.
    pub(super) unsafe fn with<T, R>(&self, f: impl FnOnce(&mut T) -> R) -> Option<R> {
        let guard = self.context.lock();
        // SAFETY: while open, the pointer is the live context of type T (per this
        // function's contract), and the lock makes this the only reference to it.
        let context = unsafe { guard.cast::<T>().as_mut() }?;
        Some(f(context))
    }

    /// The window behind a callback struct's `host_data`.
    ///
    /// # Safety
    /// `host_data` must be NULL or come from [`CallWindow::open`].
    pub(super) unsafe fn from_host_data<'a>(host_data: *mut c_void) -> Option<&'a CallWindow> {
        // SAFETY: per this function's contract; windows are never freed.
        unsafe { host_data.cast::<CallWindow>().as_ref() }
    }
}
