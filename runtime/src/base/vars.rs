//! Settings read from environment variables: a variable that is set must parse, and the error
//! names it.
use std::time::Duration;

use crate::base::error::{Error, OpKind, Result};

/// An error of opening the runtime: a setting that cannot be.
pub(crate) fn invalid(why: impl Into<String>) -> Error {
    Error::invalid(OpKind::Open, why)
}

/// Variable `name`'s value `v` (if set), parsed as `what`.
pub(crate) fn parse<T: std::str::FromStr>(name: &str, v: Option<String>, what: &str) -> Result<Option<T>> {
    v.map(|v| v.trim().parse().map_err(|_| invalid(format!("{name}={v}: want {what}")))).transpose()
}

/// `RDMALANE_POLL_SPACING_NS`'s value `v` (if set): a count of nanoseconds.
pub(crate) fn poll_spacing(v: Option<String>) -> Result<Option<Duration>> {
    Ok(parse::<u64>("RDMALANE_POLL_SPACING_NS", v, "nanoseconds")?.map(Duration::from_nanos))
}

/// `RDMALANE_TRUST_LOCAL_PEERS`'s value `v` (if set): 1 or 0 (`true`/`yes`, `false`/`no`).
pub(crate) fn trust_local_peers(v: Option<String>) -> Result<Option<bool>> {
    flag("RDMALANE_TRUST_LOCAL_PEERS", v)
}

/// Switch variable `name`'s value `v` (if set): 1 or 0 (`true`/`yes`, `false`/`no`).
pub(crate) fn flag(name: &str, v: Option<String>) -> Result<Option<bool>> {
    match v.as_deref().map(str::trim) {
        None => Ok(None),
        Some("1" | "true" | "yes") => Ok(Some(true)),
        Some("0" | "false" | "no") => Ok(Some(false)),
        Some(v) => Err(invalid(format!("{name}={v}: want 1 or 0"))),
    }
}

/// `RDMALANE_DEVICE_MEMORY`'s value `v` (if set): `auto`, `native`, `staged` or `off`.
pub(crate) fn device_policy(v: Option<String>) -> Result<Option<crate::base::memory::DevicePolicy>> {
    use crate::base::memory::DevicePolicy;
    match v.as_deref().map(str::trim) {
        None => Ok(None),
        Some("auto") => Ok(Some(DevicePolicy::Auto)),
        Some("native") => Ok(Some(DevicePolicy::Native)),
        Some("staged") => Ok(Some(DevicePolicy::Staged)),
        Some("off") => Ok(Some(DevicePolicy::Off)),
        Some(v) => Err(invalid(format!("RDMALANE_DEVICE_MEMORY={v}: want auto, native, staged or off"))),
    }
}
