//! The boundary: trampolines from the C ABI to the safe traits, the registrar, and the
//! `export_plugin!` macro. Every callback body runs inside `boundary::guard`, the one
//! place where panics are caught, turned into a status code and a message, and poison the
//! instance.
//!
//! - `boundary`: `guard` and the error buffer;
//! - `components`: each component kind's def and trampolines;
//! - `policies`: policy types' validate and build;
//! - `registrar`: what a plugin's register function is handed;
//! - `descriptor`: the static descriptor of the entry symbol.

mod boundary;
mod components;
mod descriptor;
mod policies;
mod registrar;

pub use boundary::write_error;
pub use descriptor::{Descriptor, SDK_REVISION_NUL};
pub use registrar::{run_register, Registrar};

/// Exports the entry symbol `switchyard_plugin_entry_v1` of a Rust plugin, and writes its
/// static manifest (see [`crate::manifest`]) into the library.
///
/// ```ignore
/// switchyard_plugin_sdk::export_plugin! {
///     name: "acme-routing",
///     version: env!("CARGO_PKG_VERSION"),
///     vendor: "Acme Corp",
///     register: register,   // fn(&mut Registrar) -> Result<(), PolicyError>
///     // Optional: the types `register` registers, so `plugin inspect` can list them
///     // without loading the library. The loader refuses a library whose registration
///     // differs from what it declares.
///     types: [
///         scorer("acme.least-busy", WorkerInputs::LOAD),
///         policy("acme.routing"),
///     ],
/// }
/// ```
#[macro_export]
macro_rules! export_plugin {
    (name: $name:expr, version: $version:expr, vendor: $vendor:expr, register: $register:path
     $(, types: [ $( $kind:ident ( $type_name:expr $(, $inputs:expr)? ) ),* $(,)? ])? $(,)?) => {
        #[no_mangle]
        pub extern "C" fn switchyard_plugin_entry_v1(
        ) -> *const $crate::abi::switchyard_plugin_descriptor {
            /// # Safety
            /// Called by the host with its registrar and error buffer.
            unsafe extern "C" fn on_register(
                registrar: *const $crate::abi::switchyard_registrar,
                error: *const $crate::abi::switchyard_error,
            ) -> i32 {
                // SAFETY: the host passes its registrar and error buffer for this call.
                unsafe { $crate::export::run_register(registrar, error, $register) }
            }
            static DESCRIPTOR: $crate::export::Descriptor = $crate::export::Descriptor::new(
                concat!($name, "\0"),
                concat!($version, "\0"),
                concat!($vendor, "\0"),
                on_register,
            );
            const TYPES: &[$crate::manifest::TypeDecl] = &[$($(
                $crate::manifest::TypeDecl {
                    kind: $crate::manifest::kind::$kind,
                    name: $type_name,
                    inputs: $crate::WorkerInputs::NONE$(.union($inputs))?.bits(),
                },
            )*)?];
            const LEN: usize = $crate::manifest::len($name, $version, $vendor, TYPES);
            #[used]
            #[link_section = ".switchyard_manifest"]
            static MANIFEST: [u8; LEN] =
                $crate::manifest::build::<LEN>($name, $version, $vendor, TYPES);
            // Referenced so that no linker garbage-collects the section.
            ::core::hint::black_box(&MANIFEST);
            &DESCRIPTOR.0
        }
    };
}
