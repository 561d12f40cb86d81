//! The host side of `switchyard_params`: a component's or policy's parameters from the
//! config, served to plugins as JSON text and through typed accessors.

use std::ptr;

use serde_json::{Map, Value};
use switchyard_plugin_sdk::abi::*;
use switchyard_plugin_sdk::{str_from_abi, str_to_abi, Params, RouterSettings, Status};

use super::error_buffer::host_guard;
use super::logger::PluginLogger;

/// Parameters owned by the host for as long as any instance may be (re)built from them.
#[derive(Clone, Debug, Default)]
pub struct OwnedParams {
    json: String,
    object: Map<String, Value>,
    /// The router's cost-model knobs handed with them (ABI 1.5), when the caller has them.
    router: Option<RouterSettings>,
}

impl OwnedParams {
    pub fn new(object: Map<String, Value>) -> Self {
        OwnedParams {
            json: Value::Object(object.clone()).to_string(),
            object,
            router: None,
        }
    }

    /// The same parameters, handed with the router's cost-model knobs.
    #[must_use]
    pub fn with_router(mut self, router: Option<RouterSettings>) -> Self {
        self.router = router;
        self
    }

    pub fn router(&self) -> Option<RouterSettings> {
        self.router
    }

    pub fn json(&self) -> &str {
        &self.json
    }

    /// Runs `f` with an ABI view of these parameters, valid for the call.
    pub(super) fn with_abi<R>(&self, f: impl FnOnce(&switchyard_params) -> R) -> R {
        self.with_abi_logged(None, f)
    }

    /// `with_abi`, handing `logger` (ABI 1.5) to what the call creates.
    pub(super) fn with_abi_logged<R>(
        &self,
        logger: Option<&PluginLogger>,
        f: impl FnOnce(&switchyard_params) -> R,
    ) -> R {
        let router = self.router.as_ref().map(RouterSettings::to_abi);
        let raw = switchyard_params {
            struct_size: std::mem::size_of::<switchyard_params>() as u32,
            json: str_to_abi(&self.json),
            host_data: ptr::from_ref(self).cast(),
            callback_get_number: Some(get_number),
            callback_get_bool: Some(get_bool),
            callback_get_string: Some(get_string),
            callback_key_count: Some(key_count),
            callback_key_at: Some(key_at),
            router: router.as_ref().map_or(ptr::null(), ptr::from_ref),
            logger: logger.map_or(ptr::null(), PluginLogger::abi),
        };
        f(&raw)
    }

    /// Runs `f` with the SDK's safe view, as built-in components read parameters.
    pub fn with_view<R>(&self, f: impl FnOnce(&Params<'_>) -> R) -> R {
        // SAFETY: `raw` and the params it points to live for the closure call.
        self.with_abi(|raw| f(&unsafe { Params::from_abi(raw) }))
    }
}

/// # Safety
/// `params` must be NULL or a `switchyard_params` built by `with_abi`, still in its call.
unsafe fn owner<'a>(params: *const switchyard_params) -> Option<&'a OwnedParams> {
    // SAFETY: per this function's contract, host_data points to the OwnedParams.
    unsafe {
        params
            .as_ref()
            .and_then(|p| p.host_data.cast::<OwnedParams>().as_ref())
    }
}

/// # Safety
/// As for `owner`; `key` must be NULL or `len` readable bytes.
unsafe fn lookup<'a>(
    params: *const switchyard_params,
    key: switchyard_str,
) -> Result<&'a Value, Status> {
    // SAFETY: per this function's contract.
    let owner = unsafe { owner(params) }.ok_or(Status::InvalidArgument)?;
    // SAFETY: per this function's contract.
    let key = unsafe { str_from_abi(key) }.ok_or(Status::InvalidArgument)?;
    find(&owner.object, key).ok_or(Status::NotFound)
}

/// A top-level key, or else a JSON Pointer (RFC 6901: `/limits/max`, `/weights/0`) into
/// nested objects and arrays: C plugins read structured parameters without a JSON parser.
fn find<'a>(object: &'a serde_json::Map<String, Value>, key: &str) -> Option<&'a Value> {
    if let Some(value) = object.get(key) {
        return Some(value);
    }
    let pointer = key.strip_prefix('/')?;
    let (first, rest) = match pointer.find('/') {
        Some(at) => (&pointer[..at], &pointer[at..]),
        None => (pointer, ""),
    };
    let first = first.replace("~1", "/").replace("~0", "~");
    object.get(&first)?.pointer(rest)
}

/// Writes a found value of the right type to `out`.
///
/// # Safety
/// `out` must be NULL or writable.
unsafe fn answer<T>(found: Result<Option<T>, Status>, out: *mut T) -> i32 {
    match found {
        Ok(Some(value)) if !out.is_null() => {
            // SAFETY: per this function's contract, and not NULL.
            unsafe { out.write(value) };
            Status::Ok.code()
        }
        Ok(Some(_)) => Status::InvalidArgument.code(),
        Ok(None) => Status::WrongType.code(),
        Err(status) => status.code(),
    }
}

/// # Safety
/// Called by a plugin with the params it was handed, a key and an out-pointer.
unsafe extern "C" fn get_number(
    params: *const switchyard_params,
    key: switchyard_str,
    out: *mut f64,
) -> i32 {
    // SAFETY: per this function's contract.
    host_guard(None, Status::Error.code(), || unsafe {
        answer(lookup(params, key).map(Value::as_f64), out)
    })
}

/// # Safety
/// As for `get_number`.
unsafe extern "C" fn get_bool(
    params: *const switchyard_params,
    key: switchyard_str,
    out: *mut u8,
) -> i32 {
    // SAFETY: per this function's contract.
    host_guard(None, Status::Error.code(), || unsafe {
        answer(lookup(params, key).map(|v| v.as_bool().map(u8::from)), out)
    })
}

/// # Safety
/// As for `get_number`.
unsafe extern "C" fn get_string(
    params: *const switchyard_params,
    key: switchyard_str,
    out: *mut switchyard_str,
) -> i32 {
    // SAFETY: per this function's contract.
    host_guard(None, Status::Error.code(), || unsafe {
        answer(lookup(params, key).map(|v| v.as_str().map(str_to_abi)), out)
    })
}

/// # Safety
/// Called by a plugin with the params it was handed.
unsafe extern "C" fn key_count(params: *const switchyard_params) -> usize {
    host_guard(None, 0, || {
        // SAFETY: per this function's contract.
        unsafe { owner(params) }.map_or(0, |o| o.object.len())
    })
}

/// # Safety
/// Called by a plugin with the params it was handed and an out-pointer.
unsafe extern "C" fn key_at(
    params: *const switchyard_params,
    index: usize,
    out: *mut switchyard_str,
) -> i32 {
    host_guard(None, Status::Error.code(), || {
        // SAFETY: per this function's contract.
        let Some(owner) = (unsafe { owner(params) }) else {
            return Status::InvalidArgument.code();
        };
        match owner.object.keys().nth(index) {
            // SAFETY: per this function's contract.
            Some(key) => unsafe { answer(Ok(Some(str_to_abi(key))), out) },
            None => Status::OutOfRange.code(),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_json_pointers() {
        let Value::Object(object) = serde_json::json!({
            "max": 3, "limits": {"max": 7, "a/b": 1}, "weights": [1.5, 2.5], "/odd": true
        }) else {
            unreachable!()
        };
        assert_eq!(find(&object, "max"), Some(&serde_json::json!(3)));
        assert_eq!(find(&object, "/limits/max"), Some(&serde_json::json!(7)));
        assert_eq!(find(&object, "/limits/a~1b"), Some(&serde_json::json!(1)));
        assert_eq!(find(&object, "/weights/1"), Some(&serde_json::json!(2.5)));
        assert_eq!(find(&object, "/weights/2"), None);
        assert_eq!(
            find(&object, "/weights"),
            Some(&serde_json::json!([1.5, 2.5]))
        );
        assert_eq!(
            find(&object, "/odd"),
            Some(&serde_json::json!(true)),
            "a real key first"
        );
        assert_eq!(find(&object, "limits.max"), None);
    }
}
