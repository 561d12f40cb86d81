//! The one place panics and errors cross the C boundary: `guard` catches a panic, turns
//! it into a status code and a message, and poisons the instance; the error buffer is
//! written and read here.

use core::ffi::CStr;
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::abi::*;
use crate::PolicyError;

/// Writes `message` into a host error buffer, truncated on a UTF-8 boundary.
///
/// # Safety
/// `error` must be NULL or point to a `switchyard_error` whose buffer holds `capacity`
/// writable bytes.
pub unsafe fn write_error(error: *const switchyard_error, message: &str) {
    // SAFETY: the host passes a valid buffer of `capacity` bytes (or NULL).
    let Some(error) = (unsafe { error.as_ref() }) else {
        return;
    };
    if error.buffer.is_null() || error.capacity == 0 {
        return;
    }
    let mut len = message.len().min(error.capacity - 1);
    while !message.is_char_boundary(len) {
        len -= 1;
    }
    // SAFETY: `len < capacity`, so the bytes and the NUL fit the host's buffer.
    unsafe {
        core::ptr::copy_nonoverlapping(message.as_ptr(), error.buffer.cast::<u8>(), len);
        *error.buffer.add(len) = 0;
    }
}

/// Reads back the message a host callback wrote into `error`.
///
/// # Safety
/// `error` must be NULL or the host's buffer of this call, NUL-terminated by the host.
pub(super) unsafe fn read_error(error: *const switchyard_error) -> String {
    // SAFETY: per this function's contract.
    match unsafe { error.as_ref() } {
        // SAFETY: the host NUL-terminates its buffer before handing it out.
        Some(e) if !e.buffer.is_null() && e.capacity > 0 => unsafe { CStr::from_ptr(e.buffer) }
            .to_string_lossy()
            .into_owned(),
        _ => String::new(),
    }
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("non-string panic payload")
}

/// Runs `body` at the boundary: a poisoned instance refuses the call; an error becomes
/// `status_on_error`; a panic becomes `SWITCHYARD_STATUS_PANIC` and poisons the instance.
pub(super) fn guard(
    error: *const switchyard_error,
    poisoned: Option<&mut bool>,
    status_on_error: i32,
    body: impl FnOnce() -> Result<(), PolicyError>,
) -> i32 {
    // SAFETY: every caller passes the error buffer the host handed to this callback.
    let report = |message: &str| unsafe { write_error(error, message) };
    if poisoned.as_deref() == Some(&true) {
        report("instance is poisoned: it panicked in an earlier call");
        return SWITCHYARD_STATUS_POISONED;
    }
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => SWITCHYARD_STATUS_OK,
        Ok(Err(e)) => {
            report(e.message());
            status_on_error
        }
        Err(payload) => {
            if let Some(flag) = poisoned {
                *flag = true;
            }
            report(&format!("panicked: {}", panic_message(&*payload)));
            SWITCHYARD_STATUS_PANIC
        }
    }
}
