//! The static descriptor `export_plugin!` returns from the entry symbol.

use core::ffi::c_char;

use crate::abi::*;

/// The static descriptor `export_plugin!` defines. Holds only pointers to static data.
#[repr(transparent)]
pub struct Descriptor(pub switchyard_plugin_descriptor);

// SAFETY: every pointer in it refers to immutable static data.
unsafe impl Sync for Descriptor {}

/// `SWITCHYARD_SDK_REVISION`, NUL-terminated.
pub const SDK_REVISION_NUL: &str = concat!(env!("CARGO_PKG_VERSION"), "\0");

impl Descriptor {
    pub const fn new(
        name_nul: &'static str,
        version_nul: &'static str,
        vendor_nul: &'static str,
        on_register: unsafe extern "C" fn(
            *const switchyard_registrar,
            *const switchyard_error,
        ) -> i32,
    ) -> Self {
        Descriptor(switchyard_plugin_descriptor {
            struct_size: core::mem::size_of::<switchyard_plugin_descriptor>() as u32,
            abi_major: SWITCHYARD_ABI_MAJOR,
            abi_minor: SWITCHYARD_ABI_MINOR,
            layout_fingerprint: SWITCHYARD_LAYOUT_FINGERPRINT,
            component_def_size: core::mem::size_of::<switchyard_component_def>() as u32,
            policy_def_size: core::mem::size_of::<switchyard_policy_def>() as u32,
            sdk_revision: SDK_REVISION_NUL.as_ptr() as *const c_char,
            plugin_name: name_nul.as_ptr() as *const c_char,
            plugin_version: version_nul.as_ptr() as *const c_char,
            plugin_vendor: vendor_nul.as_ptr() as *const c_char,
            on_register: Some(on_register),
        })
    }
}
