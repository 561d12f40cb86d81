//! The ABI checks a plugin's descriptor must pass before any of its code but the entry
//! symbol runs: major, minor, struct sizes, layout fingerprint, SDK revision, and the
//! descriptor's own fields. Each failed check is its own `LoadError` variant.

use std::ffi::CStr;
use std::mem::size_of;
use std::os::raw::c_char;
use std::path::Path;

use switchyard_plugin_sdk::abi::*;

use super::load_error::LoadError;

/// The highest ABI 1.x minor this host knows.
pub const HOST_ABI_MINOR: u16 = SWITCHYARD_ABI_MINOR;

/// Per ABI 1.x minor (index = minor): the layout fingerprint, the smallest size of each
/// plugin-to-host struct, and the input groups it defines. Appending a field in 1.(k+1)
/// appends a row; earlier rows are frozen numbers (a test builds a plugin against the
/// frozen 1.0 header and loads it).
const MINORS: [MinorLayout; 6] = [
    // 1.0
    MinorLayout {
        fingerprint: SWITCHYARD_LAYOUT_FINGERPRINT_1_0,
        descriptor_size: 64,
        component_def_size: 72,
        policy_def_size: 48,
        inputs: SWITCHYARD_INPUT_CACHE | SWITCHYARD_INPUT_LOAD | SWITCHYARD_INPUT_ROUTING,
    },
    // 1.1: LABELS, lifecycle notifications (component def), `callback_add_registered`.
    MinorLayout {
        fingerprint: SWITCHYARD_LAYOUT_FINGERPRINT_1_1,
        descriptor_size: 64,
        component_def_size: 96,
        policy_def_size: 48,
        inputs: SWITCHYARD_INPUT_CACHE
            | SWITCHYARD_INPUT_LOAD
            | SWITCHYARD_INPUT_ROUTING
            | SWITCHYARD_INPUT_LABELS,
    },
    // 1.2: ATTRIBUTES and ENGINE (host-to-plugin structs only; the plugin's structs are
    // 1.1's).
    MinorLayout {
        fingerprint: SWITCHYARD_LAYOUT_FINGERPRINT_1_2,
        descriptor_size: 64,
        component_def_size: 96,
        policy_def_size: 48,
        inputs: SWITCHYARD_INPUT_ALL,
    },
    // 1.3: admitters (`on_admit` appended to the component def).
    MinorLayout {
        fingerprint: SWITCHYARD_LAYOUT_FINGERPRINT_1_3,
        descriptor_size: 64,
        component_def_size: 104,
        policy_def_size: 48,
        inputs: SWITCHYARD_INPUT_ALL,
    },
    // 1.4: the pair in `switchyard_outcome` (a host-to-plugin struct; the plugin's
    // structs are 1.3's).
    MinorLayout {
        fingerprint: SWITCHYARD_LAYOUT_FINGERPRINT_1_4,
        descriptor_size: 64,
        component_def_size: 104,
        policy_def_size: 48,
        inputs: SWITCHYARD_INPUT_ALL,
    },
    // 1.5: the session's binding in `switchyard_request` (host-to-plugin structs only;
    // the plugin's structs are 1.3's).
    MinorLayout {
        fingerprint: SWITCHYARD_LAYOUT_FINGERPRINT,
        descriptor_size: size_of::<switchyard_plugin_descriptor>(),
        component_def_size: size_of::<switchyard_component_def>(),
        policy_def_size: size_of::<switchyard_policy_def>(),
        inputs: SWITCHYARD_INPUT_ALL,
    },
];

struct MinorLayout {
    fingerprint: u64,
    descriptor_size: usize,
    component_def_size: usize,
    policy_def_size: usize,
    /// The `SWITCHYARD_INPUT_*` bits this minor defines.
    inputs: u32,
}

/// The input-group bits ABI `1.minor` defines (a known minor: the descriptor check ran).
pub(super) fn inputs_of_minor(minor: u16) -> u32 {
    MINORS[usize::from(minor).min(MINORS.len() - 1)].inputs
}

/// Whether this router would accept a library declaring ABI `major.minor` with layout
/// `fingerprint` (as a manifest spells it, `0x` and hex digits): `None`, or why not. What
/// `plugin inspect` says without loading the library; loading checks it all again.
pub fn refusal_of_declared(major: u16, minor: u16, fingerprint: &str) -> Option<String> {
    if major != SWITCHYARD_ABI_MAJOR {
        return Some(format!(
            "it is built for ABI {major}.x; this router speaks ABI {SWITCHYARD_ABI_MAJOR}.x"
        ));
    }
    if minor > HOST_ABI_MINOR {
        return Some(format!(
            "it is built for ABI 1.{minor}, newer than this router's 1.{HOST_ABI_MINOR}; upgrade the router"
        ));
    }
    let expected = MINORS[usize::from(minor)].fingerprint;
    let found = u64::from_str_radix(fingerprint.trim_start_matches("0x"), 16).ok();
    if found != Some(expected) {
        return Some(format!(
            "its layout fingerprint {fingerprint} is not ABI 1.{minor}'s ({expected:#018x}): it was built against a stale or edited header"
        ));
    }
    None
}

/// How strictly the plugin's SDK revision must match the host's (`revision:` in config).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RevisionRule {
    /// Any revision of the same ABI major whose other checks pass.
    #[default]
    Compatible,
    /// Exactly the host's `SWITCHYARD_SDK_REVISION`, for teams that build in lockstep.
    Exact,
}

/// What a plugin declared, after every check passed.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct PluginInfo {
    pub name: String,
    pub version: String,
    pub vendor: String,
    pub abi_major: u16,
    pub abi_minor: u16,
    pub sdk_revision: String,
    pub layout_fingerprint: String,
    #[serde(skip)]
    pub component_def_size: usize,
    #[serde(skip)]
    pub policy_def_size: usize,
    #[serde(skip)]
    pub(super) on_register:
        Option<unsafe extern "C" fn(*const switchyard_registrar, *const switchyard_error) -> i32>,
}

/// The descriptor fields every ABI version has, in this order, at these offsets: enough to
/// read the version of a descriptor of any minor (and any major built by this project).
#[repr(C)]
struct DescriptorHead {
    struct_size: u32,
    abi_major: u16,
    abi_minor: u16,
}

/// Reads a NUL-terminated descriptor string; NULL, empty and non-UTF-8 are refused.
fn descriptor_string(
    path: &Path,
    field: &'static str,
    ptr: *const c_char,
) -> Result<String, LoadError> {
    let problem = if ptr.is_null() {
        "is NULL"
    } else {
        // SAFETY: the plugin promises NUL-terminated static strings.
        match unsafe { CStr::from_ptr(ptr) }.to_str() {
            Ok("") => "is empty",
            Ok(s) => return Ok(s.to_owned()),
            Err(_) => "is not UTF-8",
        }
    };
    Err(LoadError::InvalidDescriptor {
        path: path.to_owned(),
        field,
        problem,
    })
}

/// Runs every check on the descriptor the entry symbol returned.
///
/// # Safety
/// `descriptor` must be what the library's entry symbol returned (non-NULL checked here);
/// it must point to at least `struct_size` readable bytes.
pub(super) unsafe fn check_descriptor(
    path: &Path,
    descriptor: *const switchyard_plugin_descriptor,
    rule: RevisionRule,
) -> Result<PluginInfo, LoadError> {
    // SAFETY: per this function's contract.
    unsafe { check_descriptor_as(path, descriptor, rule, HOST_ABI_MINOR) }
}

/// The plugin's ABI: the host's major, a minor the host knows.
fn check_version(path: &Path, head: &DescriptorHead, host_minor: u16) -> Result<(), LoadError> {
    if head.abi_major != SWITCHYARD_ABI_MAJOR {
        Err(LoadError::AbiMajorMismatch {
            path: path.to_owned(),
            found: head.abi_major,
            expected: SWITCHYARD_ABI_MAJOR,
        })
    } else if head.abi_minor > host_minor {
        Err(LoadError::NewerMinor {
            path: path.to_owned(),
            found: head.abi_minor,
            host: host_minor,
        })
    } else {
        Ok(())
    }
}

/// `check_descriptor` as a router of ABI `1.host_minor` runs it (tests play an older
/// router with it).
///
/// # Safety
/// As for `check_descriptor`.
unsafe fn check_descriptor_as(
    path: &Path,
    descriptor: *const switchyard_plugin_descriptor,
    rule: RevisionRule,
    host_minor: u16,
) -> Result<PluginInfo, LoadError> {
    if descriptor.is_null() {
        return Err(LoadError::NullDescriptor {
            path: path.to_owned(),
        });
    }
    // SAFETY: every descriptor of every ABI starts with this head (per the contract).
    let head = unsafe { &*descriptor.cast::<DescriptorHead>() };
    check_version(path, head, host_minor)?;
    let minor = &MINORS[usize::from(head.abi_minor)];
    let truncated =
        |what: &'static str, found: usize, required: usize| LoadError::TruncatedStruct {
            path: path.to_owned(),
            what,
            found,
            required,
            minor: head.abi_minor,
        };
    if (head.struct_size as usize) < minor.descriptor_size {
        return Err(truncated(
            "switchyard_plugin_descriptor",
            head.struct_size as usize,
            minor.descriptor_size,
        ));
    }
    // Fields a 1.k plugin does not have stay zero in a 1.m host.
    // SAFETY: the plugin declared `struct_size` readable bytes.
    let copy = unsafe { copy_sized(descriptor, head.struct_size as usize) };

    for (what, found, required) in [
        (
            "switchyard_component_def",
            copy.component_def_size as usize,
            minor.component_def_size,
        ),
        (
            "switchyard_policy_def",
            copy.policy_def_size as usize,
            minor.policy_def_size,
        ),
    ] {
        if found < required {
            return Err(truncated(what, found, required));
        }
    }
    if copy.layout_fingerprint != minor.fingerprint {
        return Err(LoadError::LayoutMismatch {
            path: path.to_owned(),
            found: copy.layout_fingerprint,
            expected: minor.fingerprint,
            minor: head.abi_minor,
        });
    }
    let sdk_revision = descriptor_string(path, "sdk_revision", copy.sdk_revision)?;
    if rule == RevisionRule::Exact && sdk_revision != SWITCHYARD_SDK_REVISION {
        return Err(LoadError::RevisionMismatch {
            path: path.to_owned(),
            found: sdk_revision,
            expected: SWITCHYARD_SDK_REVISION.to_owned(),
        });
    }
    if copy.on_register.is_none() {
        return Err(LoadError::InvalidDescriptor {
            path: path.to_owned(),
            field: "on_register",
            problem: "is NULL",
        });
    }
    Ok(PluginInfo {
        name: descriptor_string(path, "plugin_name", copy.plugin_name)?,
        version: descriptor_string(path, "plugin_version", copy.plugin_version)?,
        vendor: descriptor_string(path, "plugin_vendor", copy.plugin_vendor)?,
        abi_major: head.abi_major,
        abi_minor: head.abi_minor,
        sdk_revision,
        layout_fingerprint: format!("{:#018x}", copy.layout_fingerprint),
        component_def_size: copy.component_def_size as usize,
        policy_def_size: copy.policy_def_size as usize,
        on_register: copy.on_register,
    })
}

/// Copies a plugin-to-host struct of `declared` bytes into a zeroed host struct (true
/// size negotiation: the host reads no byte the plugin did not declare).
///
/// # Safety
/// `ptr` must point to at least `declared` readable bytes.
/// `T` must be an ABI struct, for which all-zero bytes are a valid value.
pub(super) unsafe fn copy_sized<T>(ptr: *const T, declared: usize) -> T {
    // SAFETY: ABI structs hold integers, raw pointers and `Option`s of function pointers,
    // all valid when zero.
    let mut out: T = unsafe { std::mem::zeroed() };
    let len = declared.min(size_of::<T>());
    // SAFETY: per this function's contract the source has `len <= declared` readable
    // bytes; the destination is a distinct local of at least `len` bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(
            ptr.cast::<u8>(),
            std::ptr::from_mut(&mut out).cast::<u8>(),
            len,
        )
    };
    out
}

/// A def a plugin hands over by pointer: sized, named, copied by the host.
pub(super) trait PluginDef: Sized {
    /// The C type's name, for messages.
    const WHAT: &'static str;
    /// What it defines, for messages.
    const NOUN: &'static str;
    fn struct_size(&self) -> u32;
    /// Clears the plugin's `type_name` pointer (the host keeps its own copy), returning it.
    fn take_type_name(&mut self) -> *const c_char;
    /// The smallest `struct_size` at ABI `1.minor`.
    fn min_size(minor: u16) -> usize;
}

impl PluginDef for switchyard_component_def {
    const WHAT: &'static str = "switchyard_component_def";
    const NOUN: &'static str = "component";
    fn struct_size(&self) -> u32 {
        self.struct_size
    }
    fn take_type_name(&mut self) -> *const c_char {
        std::mem::replace(&mut self.type_name, std::ptr::null())
    }
    fn min_size(minor: u16) -> usize {
        MINORS[usize::from(minor)].component_def_size
    }
}

impl PluginDef for switchyard_policy_def {
    const WHAT: &'static str = "switchyard_policy_def";
    const NOUN: &'static str = "policy";
    fn struct_size(&self) -> u32 {
        self.struct_size
    }
    fn take_type_name(&mut self) -> *const c_char {
        std::mem::replace(&mut self.type_name, std::ptr::null())
    }
    fn min_size(minor: u16) -> usize {
        MINORS[usize::from(minor)].policy_def_size
    }
}

/// Checks a def handed over by a plugin of ABI `1.abi_minor` (not NULL, not truncated)
/// and copies it at its declared size; returns its type name and the copy.
///
/// # Safety
/// `def` must be NULL or point to at least its declared `struct_size` bytes, with
/// `type_name` NULL or NUL-terminated.
pub(super) unsafe fn read_def<T: PluginDef>(
    path: &Path,
    abi_minor: u16,
    def: *const T,
) -> Result<(String, T), LoadError> {
    // SAFETY: per this function's contract.
    let Some(head) = (unsafe { def.as_ref() }) else {
        return Err(LoadError::InvalidDefinition {
            path: path.to_owned(),
            name: "?".into(),
            problem: format!("the {} def pointer is NULL", T::NOUN),
        });
    };
    let (found, required) = (head.struct_size() as usize, T::min_size(abi_minor));
    if found < required {
        return Err(LoadError::TruncatedStruct {
            path: path.to_owned(),
            what: T::WHAT,
            found,
            required,
            minor: abi_minor,
        });
    }
    // SAFETY: the plugin declared `struct_size` readable bytes.
    let mut copy = unsafe { copy_sized(def, found) };
    let name = copy.take_type_name();
    // SAFETY: per this function's contract.
    Ok((unsafe { c_string(name) }, copy))
}

/// # Safety
/// `ptr` must be NULL or a NUL-terminated string.
pub(super) unsafe fn c_string(ptr: *const c_char) -> String {
    if ptr.is_null() {
        String::new()
    } else {
        // SAFETY: per this function's contract.
        unsafe { CStr::from_ptr(ptr) }
            .to_string_lossy()
            .into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a 1.1 host would hold if 1.1 appended one field to the descriptor.
    #[repr(C)]
    struct DescriptorV1_1 {
        v1_0: switchyard_plugin_descriptor,
        appended: u64,
    }

    #[test]
    fn a_struct_from_an_older_minor_is_copied_with_the_new_fields_zeroed() {
        // SAFETY: all-zero is a valid descriptor (integers, NULL pointers, None).
        let plugin: switchyard_plugin_descriptor = unsafe { std::mem::zeroed() };
        let plugin = switchyard_plugin_descriptor {
            struct_size: size_of::<switchyard_plugin_descriptor>() as u32,
            abi_major: 1,
            abi_minor: 0,
            layout_fingerprint: SWITCHYARD_LAYOUT_FINGERPRINT,
            ..plugin
        };
        // The plugin's struct is followed by unrelated memory the host must not read.
        #[repr(C)]
        struct InMemory {
            descriptor: switchyard_plugin_descriptor,
            next: u64,
        }
        let memory = InMemory {
            descriptor: plugin,
            next: u64::MAX,
        };
        // SAFETY: `memory.descriptor` has `struct_size` readable bytes.
        let host: DescriptorV1_1 = unsafe {
            copy_sized(
                std::ptr::from_ref(&memory.descriptor).cast::<DescriptorV1_1>(),
                memory.descriptor.struct_size as usize,
            )
        };
        assert_eq!(
            host.appended, 0,
            "a field the 1.0 plugin does not have reads as zero"
        );
        assert_eq!(host.v1_0.layout_fingerprint, SWITCHYARD_LAYOUT_FINGERPRINT);
        assert_eq!(memory.next, u64::MAX);
    }

    #[test]
    fn every_known_minor_has_a_layout_row() {
        assert_eq!(MINORS.len(), usize::from(HOST_ABI_MINOR) + 1);
        // Each minor only appends: sizes and input groups never shrink.
        for pair in MINORS.windows(2) {
            assert!(pair[1].descriptor_size >= pair[0].descriptor_size);
            assert!(pair[1].component_def_size >= pair[0].component_def_size);
            assert!(pair[1].policy_def_size >= pair[0].policy_def_size);
            assert_eq!(pair[1].inputs & pair[0].inputs, pair[0].inputs);
        }
    }

    fn descriptor_of_this_sdk() -> switchyard_plugin_descriptor {
        unsafe extern "C" fn on_register(
            _: *const switchyard_registrar,
            _: *const switchyard_error,
        ) -> i32 {
            SWITCHYARD_STATUS_OK
        }
        switchyard_plugin_descriptor {
            struct_size: size_of::<switchyard_plugin_descriptor>() as u32,
            abi_major: SWITCHYARD_ABI_MAJOR,
            abi_minor: SWITCHYARD_ABI_MINOR,
            layout_fingerprint: SWITCHYARD_LAYOUT_FINGERPRINT,
            component_def_size: size_of::<switchyard_component_def>() as u32,
            policy_def_size: size_of::<switchyard_policy_def>() as u32,
            sdk_revision: c"0.0.0".as_ptr(),
            plugin_name: c"p".as_ptr(),
            plugin_version: c"1".as_ptr(),
            plugin_vendor: c"v".as_ptr(),
            on_register: Some(on_register),
        }
    }

    #[test]
    fn a_router_of_the_previous_minor_refuses_a_plugin_of_this_one() {
        let descriptor = descriptor_of_this_sdk();
        let path = Path::new("/plugins/new.so");
        // SAFETY: a complete descriptor of this SDK.
        let this = unsafe { check_descriptor(path, &descriptor, RevisionRule::Compatible) };
        assert!(this.is_ok(), "{:?}", this.err());
        // SAFETY: as above.
        let older = unsafe {
            check_descriptor_as(
                path,
                &descriptor,
                RevisionRule::Compatible,
                SWITCHYARD_ABI_MINOR - 1,
            )
        };
        let message = older.expect_err("an older router must refuse").to_string();
        assert!(
            message.contains(&format!("ABI 1.{SWITCHYARD_ABI_MINOR}"))
                && message.contains(&format!("ABI 1.{}", SWITCHYARD_ABI_MINOR - 1)),
            "{message}"
        );
    }
}
