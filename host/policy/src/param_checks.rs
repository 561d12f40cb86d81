//! Checks of built-in components' parameters, shared by every built-in.

use switchyard_plugin_sdk::PolicyError;

pub fn finite_non_negative(name: &str, value: f64) -> Result<f64, PolicyError> {
    if value.is_finite() && value >= 0.0 {
        Ok(value)
    } else {
        Err(PolicyError::failed(format!(
            "`{name}` must be a finite number >= 0, got {value}"
        )))
    }
}
