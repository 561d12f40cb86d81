//! The status codes of ABI v1 as a Rust type.
//!
//! Every callback across the boundary returns an `int32_t`. A plugin may return any value,
//! so a code the ABI does not define is kept as [`Status::Unknown`] instead of being
//! refused or mapped to another status.

use core::fmt;

use crate::abi::*;

/// A `SWITCHYARD_STATUS_*` code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Status {
    /// The call succeeded; out-parameters are written.
    Ok,
    /// The call failed; the message is in the error buffer.
    Error,
    /// Parameters are missing, of the wrong type, out of range or unknown.
    InvalidParameters,
    /// A panic or exception escaped the component; the SDK poisoned the instance.
    Panic,
    /// The instance panicked or threw earlier and refuses every call.
    Poisoned,
    /// Parameter accessor: no such key.
    NotFound,
    /// Parameter accessor: the key holds another type.
    WrongType,
    /// An index is out of range.
    OutOfRange,
    /// Registrar or builder: an argument is invalid.
    InvalidArgument,
    /// Registrar: the type name is already registered.
    Duplicate,
    /// A code ABI v1 does not define.
    Unknown(i32),
}

impl Status {
    /// Every status the ABI defines, in code order.
    pub const DEFINED: [Status; 10] = [
        Status::Ok,
        Status::Error,
        Status::InvalidParameters,
        Status::Panic,
        Status::Poisoned,
        Status::NotFound,
        Status::WrongType,
        Status::OutOfRange,
        Status::InvalidArgument,
        Status::Duplicate,
    ];

    /// The status a callback returned.
    pub fn from_code(code: i32) -> Self {
        match code {
            SWITCHYARD_STATUS_OK => Status::Ok,
            SWITCHYARD_STATUS_ERROR => Status::Error,
            SWITCHYARD_STATUS_INVALID_PARAMETERS => Status::InvalidParameters,
            SWITCHYARD_STATUS_PANIC => Status::Panic,
            SWITCHYARD_STATUS_POISONED => Status::Poisoned,
            SWITCHYARD_STATUS_NOT_FOUND => Status::NotFound,
            SWITCHYARD_STATUS_WRONG_TYPE => Status::WrongType,
            SWITCHYARD_STATUS_OUT_OF_RANGE => Status::OutOfRange,
            SWITCHYARD_STATUS_INVALID_ARGUMENT => Status::InvalidArgument,
            SWITCHYARD_STATUS_DUPLICATE => Status::Duplicate,
            other => Status::Unknown(other),
        }
    }

    /// The code to return across the ABI.
    pub fn code(self) -> i32 {
        match self {
            Status::Ok => SWITCHYARD_STATUS_OK,
            Status::Error => SWITCHYARD_STATUS_ERROR,
            Status::InvalidParameters => SWITCHYARD_STATUS_INVALID_PARAMETERS,
            Status::Panic => SWITCHYARD_STATUS_PANIC,
            Status::Poisoned => SWITCHYARD_STATUS_POISONED,
            Status::NotFound => SWITCHYARD_STATUS_NOT_FOUND,
            Status::WrongType => SWITCHYARD_STATUS_WRONG_TYPE,
            Status::OutOfRange => SWITCHYARD_STATUS_OUT_OF_RANGE,
            Status::InvalidArgument => SWITCHYARD_STATUS_INVALID_ARGUMENT,
            Status::Duplicate => SWITCHYARD_STATUS_DUPLICATE,
            Status::Unknown(code) => code,
        }
    }

    /// What the status means, in a few words, for messages.
    pub fn name(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Error => "error",
            Status::InvalidParameters => "invalid parameters",
            Status::Panic => "panicked",
            Status::Poisoned => "poisoned",
            Status::NotFound => "not found",
            Status::WrongType => "wrong type",
            Status::OutOfRange => "out of range",
            Status::InvalidArgument => "invalid argument",
            Status::Duplicate => "duplicate",
            Status::Unknown(_) => "unknown status",
        }
    }

    pub fn is_ok(self) -> bool {
        self == Status::Ok
    }
}

/// `status N`: the code, as messages have always shown it (tools grep for it).
impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "status {}", self.code())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_unknown_codes_are_kept() {
        for status in Status::DEFINED {
            assert_eq!(Status::from_code(status.code()), status);
            assert_ne!(status.name(), "unknown status");
        }
        assert_eq!(Status::from_code(42), Status::Unknown(42));
        assert_eq!(Status::Unknown(42).code(), 42);
        assert_eq!(Status::from_code(-1).name(), "unknown status");
    }
}
