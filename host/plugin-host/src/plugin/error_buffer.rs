//! The host-owned error buffer handed to every plugin callback, what a failed call reports,
//! and the guard every host `extern "C"` function runs its body in.

use std::panic::{catch_unwind, AssertUnwindSafe};

use switchyard_plugin_sdk::abi::switchyard_error;
use switchyard_plugin_sdk::{write_error, Status};

/// A host-owned buffer a plugin writes its error message into.
pub struct ErrorBuffer {
    bytes: [u8; 1024],
}

impl ErrorBuffer {
    pub fn new() -> Self {
        ErrorBuffer { bytes: [0; 1024] }
    }

    /// The ABI form, cleared, for one call.
    #[inline]
    pub(super) fn as_abi(&mut self) -> switchyard_error {
        self.bytes[0] = 0;
        switchyard_error {
            buffer: self.bytes.as_mut_ptr().cast(),
            capacity: self.bytes.len(),
        }
    }

    /// The bytes a plugin wrote, up to the NUL (empty when it wrote none).
    pub fn written(&self) -> &[u8] {
        let end = self
            .bytes
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(self.bytes.len());
        &self.bytes[..end]
    }

    /// The message a plugin wrote (always NUL-terminated within the buffer).
    pub fn message(&self) -> String {
        match String::from_utf8_lossy(self.written()) {
            m if m.is_empty() => "(the plugin gave no message)".to_owned(),
            m => m.into_owned(),
        }
    }

    /// `Ok` for a status of OK, otherwise the status with the plugin's message.
    #[inline]
    pub(super) fn check(&self, code: i32) -> Result<(), CallError> {
        if code == Status::Ok.code() {
            Ok(())
        } else {
            Err(self.failed(code))
        }
    }

    #[cold]
    fn failed(&self, code: i32) -> CallError {
        CallError {
            status: Status::from_code(code),
            message: self.message(),
        }
    }
}

impl Default for ErrorBuffer {
    fn default() -> Self {
        Self::new()
    }
}

/// A plugin (or built-in) call that did not return OK: its status and its own message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message} ({status})")]
pub struct CallError {
    pub status: Status,
    pub message: String,
}

impl CallError {
    pub fn new(status: Status, message: impl Into<String>) -> Self {
        CallError {
            status,
            message: message.into(),
        }
    }
}

/// Runs the body of a host `extern "C"` function. A panic in host code must not unwind
/// into the plugin's (C) frames: it returns `on_panic` instead, with the panic's message
/// written to `error` when the callback has one.
pub(super) fn host_guard<T>(
    error: Option<*const switchyard_error>,
    on_panic: T,
    body: impl FnOnce() -> T,
) -> T {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(code) => code,
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .copied()
                .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
                .unwrap_or("non-string panic payload");
            if let Some(error) = error {
                // SAFETY: `error` is the buffer the plugin passed to this host callback.
                unsafe { write_error(error, &format!("the router failed internally: {what}")) };
            }
            tracing::error!(
                panic = what,
                "a host callback panicked; the plugin gets an error"
            );
            on_panic
        }
    }
}
