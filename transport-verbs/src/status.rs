//! Completion statuses and return codes as the runtime reads them.
use std::ffi::CStr;

use rdma_sys::ibv_wc_status as st;
use rdmalane::{FailureClass, TransportError};

/// How the runtime should read a work completion's status.
pub(crate) fn class_of(status: st::Type) -> FailureClass {
    match status {
        st::IBV_WC_REM_ACCESS_ERR | st::IBV_WC_REM_OP_ERR => FailureClass::RemoteAccess,
        st::IBV_WC_RETRY_EXC_ERR | st::IBV_WC_RNR_RETRY_EXC_ERR | st::IBV_WC_REM_ABORT_ERR => {
            FailureClass::PeerUnreachable
        }
        st::IBV_WC_WR_FLUSH_ERR => FailureClass::Cancelled,
        st::IBV_WC_LOC_LEN_ERR => FailureClass::Truncated,
        _ => FailureClass::Other,
    }
}

/// The error a failed work completion stands for.
pub(crate) fn wc_error(provider: &str, status: st::Type, vendor_err: u32) -> TransportError {
    // SAFETY: ibv_wc_status_str returns a static string for any value.
    let text = unsafe { CStr::from_ptr(rdma_sys::ibv_wc_status_str(status)) }.to_string_lossy();
    TransportError {
        provider: provider.to_string(),
        errno: status as i32,
        text: format!("{text} (wc status {status}, vendor_err {vendor_err:#x})"),
        class: class_of(status),
    }
}

/// The error for a verbs call that returned `ret` (an errno, positive or negative) or set errno.
pub(crate) fn call_error(provider: &str, what: &str, ret: i32) -> TransportError {
    let errno = if ret == 0 || ret == -1 {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
    } else {
        ret.abs()
    };
    let class = match errno {
        libc::ECONNRESET | libc::ECONNREFUSED | libc::ENOTCONN | libc::EHOSTUNREACH => {
            FailureClass::PeerUnreachable
        }
        _ => FailureClass::Other,
    };
    TransportError {
        provider: provider.to_string(),
        errno,
        text: format!("{what}: {}", std::io::Error::from_raw_os_error(errno)),
        class,
    }
}

/// An error of ours (not the device's), e.g. a lane that failed earlier.
pub(crate) fn plain(provider: &str, class: FailureClass, text: String) -> TransportError {
    TransportError { provider: provider.to_string(), errno: 0, text, class }
}
