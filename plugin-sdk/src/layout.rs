//! The layout fingerprint of ABI v1, computed from abi_stable's type layouts.
//!
//! Every ABI struct is walked (name, size, alignment, each field's name and type, each
//! callback's full signature) into a canonical text that is hashed with FNV-1a. The
//! constant `SWITCHYARD_LAYOUT_FINGERPRINT` in `abi.rs` (and so in the C header) must equal
//! what this computes; a unit test enforces it, so editing an ABI struct without updating
//! the constant fails the build's tests rather than shipping a silent layout change.

use abi_stable::type_layout::{TLData, TypeLayout};
use abi_stable::StableAbi;

use crate::abi::*;

fn describe(layout: &'static TypeLayout, out: &mut String) {
    use std::fmt::Write;
    let _ = write!(
        out,
        "{}[size={},align={}]",
        layout.full_type(),
        layout.size(),
        layout.alignment()
    );
    if let TLData::Struct { fields } = layout.data() {
        out.push('{');
        for field in fields.iter() {
            let inner = field.layout();
            let mut full_type = inner.full_type().to_string();
            // The host's callbacks are typed `Option<..>` in Rust so a NULL from a stale
            // or hostile peer is caught, but C's contract (the 1.0 header) is "never NULL":
            // describe them as 1.0 did. Same C layout, same fingerprint.
            if field.name().starts_with("callback_") {
                if let Some(bare) = full_type
                    .strip_prefix("Option<")
                    .and_then(|t| t.strip_suffix('>'))
                {
                    full_type = bare.to_owned();
                }
            }
            let _ = write!(
                out,
                "{}:{}[size={},align={}]",
                field.name(),
                full_type,
                inner.size(),
                inner.alignment()
            );
            // Callbacks (bare or inside Option) carry their signatures here. `unsafe` is
            // Rust's calling discipline, not part of the C layout.
            for function in field.function_range().iter() {
                let signature = function.to_string();
                let signature = signature.strip_prefix("unsafe ").unwrap_or(&signature);
                let _ = write!(out, "={signature}");
            }
            out.push(';');
        }
        out.push('}');
    }
    out.push('\n');
}

/// The canonical description of every ABI v1 struct, one per line.
pub fn layout_description() -> String {
    let roots: [&'static TypeLayout; 19] = [
        switchyard_str::LAYOUT,
        switchyard_error::LAYOUT,
        switchyard_partition::LAYOUT,
        switchyard_session::LAYOUT,
        switchyard_request::LAYOUT,
        switchyard_request_attributes::LAYOUT,
        switchyard_candidates::LAYOUT,
        switchyard_engine_load::LAYOUT,
        switchyard_outcome::LAYOUT,
        switchyard_saturation::LAYOUT,
        switchyard_admission::LAYOUT,
        switchyard_params::LAYOUT,
        switchyard_router_settings::LAYOUT,
        switchyard_logger::LAYOUT,
        switchyard_component_def::LAYOUT,
        switchyard_policy_builder::LAYOUT,
        switchyard_policy_def::LAYOUT,
        switchyard_registrar::LAYOUT,
        switchyard_plugin_descriptor::LAYOUT,
    ];
    let mut out = String::new();
    for layout in roots {
        describe(layout, &mut out);
    }
    out
}

/// FNV-1a (64-bit) of `layout_description()`.
pub fn layout_fingerprint() -> u64 {
    layout_description()
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325u64, |hash, byte| {
            (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
        })
}

#[cfg(test)]
mod tests {
    #[test]
    fn fingerprint_constant_matches_the_layouts() {
        let computed = super::layout_fingerprint();
        assert_eq!(
            crate::abi::SWITCHYARD_LAYOUT_FINGERPRINT,
            computed,
            "the ABI layout changed: set SWITCHYARD_LAYOUT_FINGERPRINT in plugin-sdk/src/abi.rs \
             to {computed:#x}, regenerate the header, and, if this is a released major, \
             append fields in a new minor instead.\nlayout:\n{}",
            super::layout_description()
        );
    }
}
