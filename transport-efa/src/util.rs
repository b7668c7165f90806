//! Small helpers around libfabric's error reporting.
use std::ffi::CStr;

use rdmalane::{FailureClass, TransportError};

use crate::ffi;

/// `fi_strerror` text for a (negative or positive) libfabric return code.
pub(crate) fn fi_error(ret: impl Into<i64>) -> String {
    let code = ret.into().unsigned_abs() as i32;
    // SAFETY: fi_strerror returns a static string for any code.
    unsafe { CStr::from_ptr(ffi::fi_strerror(code)).to_string_lossy().into_owned() }
}

/// Read an errno as the runtime should treat it.
// The casts look redundant on 1.17's bindings; bindgen picks other integer types for these
// constants in other header versions.
#[allow(clippy::unnecessary_cast)]
pub(crate) fn classify(errno: i32) -> FailureClass {
    let e = errno as u32;
    if e == (ffi::FI_EACCES as u32)
        || e == (ffi::FI_EKEYREJECTED as u32)
        || e == (ffi::FI_EPERM as u32)
        || e == (ffi::FI_EREMOTEIO as u32)
    {
        FailureClass::RemoteAccess
    } else if e == (ffi::FI_ECONNRESET as u32)
        || e == (ffi::FI_ECONNREFUSED as u32)
        || e == (ffi::FI_ECONNABORTED as u32)
        || e == (ffi::FI_ENOTCONN as u32)
        || e == (ffi::FI_EHOSTUNREACH as u32)
        || e == (ffi::FI_ESHUTDOWN as u32)
        || e == libc::EPIPE as u32
        || e == (ffi::FI_EADDRNOTAVAIL as u32)
    {
        FailureClass::PeerUnreachable
    } else if e == (ffi::FI_ECANCELED as u32) {
        FailureClass::Cancelled
    } else if e == (ffi::FI_ETRUNC as u32) || e == (ffi::FI_EMSGSIZE as u32) {
        FailureClass::Truncated
    } else {
        FailureClass::Other
    }
}

/// A TransportError from a return code.
pub(crate) fn terr(provider: &str, ret: impl Into<i64>, what: &str) -> TransportError {
    let ret = ret.into();
    let errno = ret.unsigned_abs() as i32;
    TransportError {
        provider: provider.to_string(),
        errno,
        text: format!("{what}: {}", fi_error(ret)),
        class: classify(errno),
    }
}
