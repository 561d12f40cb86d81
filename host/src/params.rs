//! The host side of `switchyard_params`: a component's or policy's parameters from the
//! config, served to plugins as JSON text and through typed accessors.

use std::ptr;

use serde_json::{Map, Value};
use switchyard_plugin_sdk::abi::*;
use switchyard_plugin_sdk::{str_from_abi, str_to_abi, Params};

/// Parameters owned by the host for as long as any instance may be (re)built from them.
#[derive(Clone, Debug, Default)]
pub struct OwnedParams {
    json: String,
    object: Map<String, Value>,
}

impl OwnedParams {
    pub fn new(object: Map<String, Value>) -> Self {
        OwnedParams {
            json: Value::Object(object.clone()).to_string(),
            object,
        }
    }

    pub fn json(&self) -> &str {
        &self.json
    }

    /// Runs `f` with an ABI view of these parameters, valid for the call.
    pub fn with_abi<R>(&self, f: impl FnOnce(&switchyard_params) -> R) -> R {
        let raw = switchyard_params {
            struct_size: std::mem::size_of::<switchyard_params>() as u32,
            json: str_to_abi(&self.json),
            host_data: ptr::from_ref(self).cast(),
            callback_get_number: get_number,
            callback_get_bool: get_bool,
            callback_get_string: get_string,
            callback_key_count: key_count,
            callback_key_at: key_at,
        };
        f(&raw)
    }

    /// Runs `f` with the SDK's safe view, as built-in components read parameters.
    pub fn with_view<R>(&self, f: impl FnOnce(&Params<'_>) -> R) -> R {
        // SAFETY: `raw` lives for the closure call.
        self.with_abi(|raw| f(&unsafe { Params::from_abi(raw) }))
    }
}

/// # Safety
/// `params` must be a `switchyard_params` built by `with_abi`.
unsafe fn owner<'a>(params: *const switchyard_params) -> Option<&'a OwnedParams> {
    params
        .as_ref()
        .and_then(|p| p.host_data.cast::<OwnedParams>().as_ref())
}

fn lookup<'a>(params: *const switchyard_params, key: switchyard_str) -> Result<&'a Value, i32> {
    let owner = unsafe { owner(params) }.ok_or(SWITCHYARD_STATUS_INVALID_ARGUMENT)?;
    let key = unsafe { str_from_abi(key) }.ok_or(SWITCHYARD_STATUS_INVALID_ARGUMENT)?;
    owner.object.get(key).ok_or(SWITCHYARD_STATUS_NOT_FOUND)
}

fn answer<T>(found: Result<Option<T>, i32>, out: *mut T) -> i32 {
    match found {
        Ok(Some(value)) if !out.is_null() => {
            unsafe { out.write(value) };
            SWITCHYARD_STATUS_OK
        }
        Ok(Some(_)) => SWITCHYARD_STATUS_INVALID_ARGUMENT,
        Ok(None) => SWITCHYARD_STATUS_WRONG_TYPE,
        Err(status) => status,
    }
}

extern "C" fn get_number(
    params: *const switchyard_params,
    key: switchyard_str,
    out: *mut f64,
) -> i32 {
    answer(lookup(params, key).map(Value::as_f64), out)
}

extern "C" fn get_bool(params: *const switchyard_params, key: switchyard_str, out: *mut u8) -> i32 {
    answer(lookup(params, key).map(|v| v.as_bool().map(u8::from)), out)
}

extern "C" fn get_string(
    params: *const switchyard_params,
    key: switchyard_str,
    out: *mut switchyard_str,
) -> i32 {
    answer(lookup(params, key).map(|v| v.as_str().map(str_to_abi)), out)
}

extern "C" fn key_count(params: *const switchyard_params) -> usize {
    unsafe { owner(params) }.map_or(0, |o| o.object.len())
}

extern "C" fn key_at(
    params: *const switchyard_params,
    index: usize,
    out: *mut switchyard_str,
) -> i32 {
    let Some(owner) = (unsafe { owner(params) }) else {
        return SWITCHYARD_STATUS_INVALID_ARGUMENT;
    };
    match owner.object.keys().nth(index) {
        Some(key) => answer(Ok(Some(str_to_abi(key))), out),
        None => SWITCHYARD_STATUS_OUT_OF_RANGE,
    }
}
