pub mod abi;
#[cfg(feature = "layout")]
pub mod layout;
