//! Component and policy parameters, as the host hands them over.

use serde::de::DeserializeOwned;

use crate::abi::*;
use crate::view::{str_from_abi, str_to_abi};
use crate::PolicyError;

/// The router's built-in cost model as configured (ABI 1.5,
/// `worker_selection.builtin_default` with its defaults; docs/default-policy.md), handed
/// read-only to factories and component creation.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RouterSettings {
    pub block_size: u32,
    pub host_cache_weight: f64,
    pub disk_cache_weight: f64,
    pub uncached_weight: f64,
    pub prefill_load_scale: f64,
    pub temperature: f64,
    pub engine_load_weight: f64,
}

impl RouterSettings {
    /// The ABI form, borrowed by `switchyard_params.router`.
    pub fn to_abi(&self) -> switchyard_router_settings {
        switchyard_router_settings {
            struct_size: core::mem::size_of::<switchyard_router_settings>() as u32,
            block_size: self.block_size,
            host_cache_weight: self.host_cache_weight,
            disk_cache_weight: self.disk_cache_weight,
            uncached_weight: self.uncached_weight,
            prefill_load_scale: self.prefill_load_scale,
            temperature: self.temperature,
            engine_load_weight: self.engine_load_weight,
        }
    }
}

/// The parameters of one component or policy instance: JSON text plus typed accessors.
#[derive(Clone, Copy)]
pub struct Params<'a> {
    raw: &'a switchyard_params,
}

impl<'a> Params<'a> {
    /// # Safety
    /// `raw` must be valid host-provided params for `'a`.
    pub unsafe fn from_abi(raw: &'a switchyard_params) -> Self {
        Params { raw }
    }

    /// The router's built-in cost-model knobs (ABI 1.5), read-only: `None` from a router
    /// older than 1.5, or a caller that has none.
    pub fn router_settings(&self) -> Option<RouterSettings> {
        let end = core::mem::offset_of!(switchyard_params, router) + core::mem::size_of::<usize>();
        if (self.raw.struct_size as usize) < end {
            return None;
        }
        // SAFETY: the host guarantees `router` is NULL or valid as long as the params.
        let raw = unsafe { self.raw.router.as_ref() }?;
        let has = |field_end: usize| raw.struct_size as usize >= field_end;
        has(core::mem::offset_of!(switchyard_router_settings, engine_load_weight) + 8).then_some(
            RouterSettings {
                block_size: raw.block_size,
                host_cache_weight: raw.host_cache_weight,
                disk_cache_weight: raw.disk_cache_weight,
                uncached_weight: raw.uncached_weight,
                prefill_load_scale: raw.prefill_load_scale,
                temperature: raw.temperature,
                engine_load_weight: raw.engine_load_weight,
            },
        )
    }

    /// The router's log for what this call creates (ABI 1.5): the factory `on_validate`
    /// makes or the instance `on_create` makes; `None` from an older router. Keep it to
    /// log outside the router's calls; inside them `tracing` events reach it anyway.
    pub fn logger(&self) -> Option<crate::Logger> {
        let end = core::mem::offset_of!(switchyard_params, logger) + core::mem::size_of::<usize>();
        if (self.raw.struct_size as usize) < end {
            return None;
        }
        // SAFETY: the host's logger is NULL or valid until what this call creates is
        // destroyed.
        unsafe { crate::Logger::from_abi(self.raw.logger) }
    }

    /// The parameters object as JSON text.
    pub fn json(&self) -> &'a str {
        // SAFETY: the host's JSON text lives as long as the params (`from_abi`).
        unsafe { str_from_abi(self.raw.json) }.unwrap_or("{}")
    }

    /// Deserializes the parameters. Use `#[serde(deny_unknown_fields)]` on `T` so unknown
    /// keys are rejected at startup.
    pub fn deserialize<T: DeserializeOwned>(&self) -> Result<T, PolicyError> {
        serde_json::from_str(self.json())
            .map_err(|e| PolicyError::failed(format!("invalid parameters: {e}")))
    }

    pub fn get_number(&self, key: &str) -> Result<Option<f64>, PolicyError> {
        let mut out = 0.0;
        let get = host_callback(self.raw.callback_get_number, "get_number")?;
        // SAFETY: the host's callback with its own params, a key and an out-pointer that
        // outlive the call.
        let status = unsafe { get(self.raw, str_to_abi(key), &mut out) };
        lookup(status, key, "a number").map(|found| found.then_some(out))
    }

    pub fn get_bool(&self, key: &str) -> Result<Option<bool>, PolicyError> {
        let mut out = 0u8;
        let get = host_callback(self.raw.callback_get_bool, "get_bool")?;
        // SAFETY: as in `get_number`.
        let status = unsafe { get(self.raw, str_to_abi(key), &mut out) };
        lookup(status, key, "a boolean").map(|found| found.then_some(out != 0))
    }

    pub fn get_string(&self, key: &str) -> Result<Option<&'a str>, PolicyError> {
        let mut out = switchyard_str {
            ptr: core::ptr::null(),
            len: 0,
        };
        let get = host_callback(self.raw.callback_get_string, "get_string")?;
        // SAFETY: as in `get_number`.
        let status = unsafe { get(self.raw, str_to_abi(key), &mut out) };
        lookup(status, key, "a string").map(|found| {
            // SAFETY: on OK the host wrote a string that lives as long as the params.
            found.then(|| unsafe { str_from_abi(out) }.unwrap_or(""))
        })
    }

    /// The top-level keys, in config order.
    pub fn keys(&self) -> impl Iterator<Item = &'a str> + 'a {
        let raw = self.raw;
        let (count, key_at) = match (raw.callback_key_count, raw.callback_key_at) {
            // SAFETY: the host's callback with its own params.
            (Some(count), Some(key_at)) => (unsafe { count(raw) }, Some(key_at)),
            _ => (0, None),
        };
        (0..count).filter_map(move |index| {
            let mut out = switchyard_str {
                ptr: core::ptr::null(),
                len: 0,
            };
            // SAFETY: the host's callback with its own params and an out-pointer.
            let status = unsafe { key_at?(raw, index, &mut out) };
            // SAFETY: on OK the host wrote a key that lives as long as the params.
            (status == SWITCHYARD_STATUS_OK)
                .then(|| unsafe { str_from_abi(out) })
                .flatten()
        })
    }

    /// Fails naming the first key not in `allowed`.
    pub fn reject_unknown_keys(&self, allowed: &[&str]) -> Result<(), PolicyError> {
        match self.keys().find(|key| !allowed.contains(key)) {
            Some(key) => Err(PolicyError::failed(format!(
                "unknown parameter `{key}`; expected one of: {}",
                allowed.join(", ")
            ))),
            None => Ok(()),
        }
    }
}

/// A host callback of the params, or an error naming it if the host left it NULL.
fn host_callback<F>(callback: Option<F>, name: &str) -> Result<F, PolicyError> {
    callback.ok_or_else(|| PolicyError::failed(format!("the host's params have no {name}")))
}

fn lookup(status: i32, key: &str, expected: &str) -> Result<bool, PolicyError> {
    match status {
        SWITCHYARD_STATUS_OK => Ok(true),
        SWITCHYARD_STATUS_NOT_FOUND => Ok(false),
        SWITCHYARD_STATUS_WRONG_TYPE => Err(PolicyError::failed(format!(
            "parameter `{key}` must be {expected}"
        ))),
        other => Err(PolicyError::failed(format!(
            "reading parameter `{key}` failed with status {other}"
        ))),
    }
}
