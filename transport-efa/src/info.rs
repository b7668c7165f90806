//! Provider selection: names, hints, fi_getinfo, and what to say when nothing matches.
use std::ffi::{CStr, CString};
use std::ptr;

use rdmalane::{Error, Result};

use crate::ffi;
use crate::util::fi_error;

/// The API version we ask for: the headers we were built against, so EFA hosts with newer
/// libfabric get its newer behaviour (device RDMA write needs >= 1.18).
pub(crate) const API_VERSION: u32 = (ffi::FI_MAJOR_VERSION << 16) | ffi::FI_MINOR_VERSION;

/// The order tried when no provider is named: EFA where present, shm on one host, then TCP.
pub(crate) const PREFERENCE: [&str; 3] = ["efa", "shm", "tcp;ofi_rxm"];

/// Expand short names to libfabric provider strings.
pub fn provider_string(name: &str) -> String {
    match name {
        "tcp" => "tcp;ofi_rxm".into(),
        "verbs" => "verbs;ofi_rxm".into(),
        other => other.into(),
    }
}

/// An owned `fi_info` list.
pub(crate) struct InfoList(pub *mut ffi::fi_info);

impl Drop for InfoList {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: allocated by fi_getinfo/fi_allocinfo, freed once.
            unsafe { ffi::fi_freeinfo(self.0) };
        }
    }
}

/// Whether to ask for device memory (FI_HMEM).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Hmem {
    /// Device memory is wanted.
    pub wanted: bool,
    /// Even from a provider that completes device-memory ops before their copies land (shm).
    pub early_ok: bool,
}

/// fi_getinfo for an RDM endpoint with RMA and directed receives on `prov`.
/// `trust_local`: let shm take its fast, unchecked path for one-sided ops. `hmem`: ask for
/// device memory (FI_HMEM, registered as such: FI_MR_HMEM) first, and take the provider
/// without it where it has none.
pub(crate) fn getinfo(
    prov: &str,
    node: Option<&str>,
    trust_local: bool,
    hmem: Hmem,
) -> Result<InfoList, i32> {
    // shm's FI_HMEM completes before its copies land: not asked for unless that is accepted.
    // (Asked for, it also changes shm 1.17's host-memory path: two tenants' bulk streams on
    // one peer then got 775:1 instead of 1:1 on 16 cores.)
    let hmem = hmem.wanted && (prov != "shm" || hmem.early_ok);
    // SAFETY: fi_allocinfo returns a zeroed info with its attr structs allocated, or null.
    let hints = InfoList(unsafe { ffi::fi_allocinfo() });
    assert!(!hints.0.is_null(), "fi_allocinfo: out of memory");
    let prov_c = CString::new(prov).map_err(|_| -(ffi::FI_EINVAL as i32))?;
    // SAFETY: hints and its attrs were allocated by fi_allocinfo; prov_name must be malloc'd
    // because fi_freeinfo frees it, hence strdup.
    unsafe {
        let h = &mut *hints.0;
        h.caps = (ffi::FI_MSG | ffi::FI_RMA) as u64
            | (ffi::FI_READ | ffi::FI_WRITE | ffi::FI_REMOTE_READ | ffi::FI_REMOTE_WRITE) as u64
            | (ffi::FI_SEND | ffi::FI_RECV) as u64
            | ffi::FI_DIRECTED_RECV;
        h.mode = ffi::FI_CONTEXT | ffi::FI_CONTEXT2;
        (*h.ep_attr).type_ = ffi::fi_ep_type_FI_EP_RDM;
        (*h.domain_attr).mr_mode = (ffi::FI_MR_LOCAL
            | ffi::FI_MR_VIRT_ADDR
            | ffi::FI_MR_ALLOCATED
            | ffi::FI_MR_PROV_KEY
            | ffi::FI_MR_ENDPOINT) as i32;
        (*h.domain_attr).threading = ffi::fi_threading_FI_THREAD_DOMAIN;
        if prov == "shm" && !trust_local {
            // Without ordering asked for, shm takes a "fast" path for one-sided ops: the
            // initiator reads or writes the target's memory itself (process_vm_readv/writev)
            // at the address it names, checking neither key, nor range, nor access. Asking for
            // ordering routes every one-sided op through the target, which checks all three.
            (*h.tx_attr).msg_order =
                (ffi::FI_ORDER_RAR | ffi::FI_ORDER_RAW | ffi::FI_ORDER_WAR | ffi::FI_ORDER_WAW) as u64;
            // The target's progress then serves peers' one-sided ops: a counter of them tells
            // its reactor there is traffic to keep polling for (`Transport::remote_served`).
            h.caps |= ffi::FI_RMA_EVENT;
        }
        (*h.fabric_attr).prov_name = libc::strdup(prov_c.as_ptr());
    }
    let node_c = node.map(|n| CString::new(n).map_err(|_| -(ffi::FI_EINVAL as i32))).transpose()?;
    let (node_p, flags) = match &node_c {
        Some(n) => (n.as_ptr(), ffi::FI_SOURCE),
        None => (ptr::null(), 0),
    };
    let mut out: *mut ffi::fi_info = ptr::null_mut();
    // SAFETY: hints is valid; reading its caps.
    let rma_event = unsafe { (*hints.0).caps } & ffi::FI_RMA_EVENT != 0;
    // Device memory first, with the served-ops counter and without it (a provider without the
    // counter still checks; its idle reactor then naps between ops); then the same without
    // device memory (a libfabric built without CUDA, a provider without FI_HMEM: the runtime
    // stages device memory or refuses it).
    let mut ret = -(ffi::FI_ENODATA as i32);
    for (with_hmem, with_rma_event) in [(true, true), (true, false), (false, true), (false, false)] {
        if (with_hmem && !hmem) || (with_rma_event && !rma_event) {
            continue;
        }
        // SAFETY: hints and its domain attributes are valid; setting and clearing our bits.
        unsafe {
            let h = &mut *hints.0;
            h.caps &= !(ffi::FI_HMEM | ffi::FI_RMA_EVENT);
            (*h.domain_attr).mr_mode &= !(ffi::FI_MR_HMEM as i32);
            if with_hmem {
                h.caps |= ffi::FI_HMEM;
                (*h.domain_attr).mr_mode |= ffi::FI_MR_HMEM as i32;
            }
            if with_rma_event {
                h.caps |= ffi::FI_RMA_EVENT;
            }
        }
        // SAFETY: valid hints, out-pointer, and C strings that outlive the call.
        ret = unsafe { ffi::fi_getinfo(API_VERSION, node_p, ptr::null(), flags, hints.0, &mut out) };
        if ret != -(ffi::FI_ENODATA as i32) {
            break;
        }
        if with_hmem && !with_rma_event {
            tracing::debug!(provider = prov, "no FI_HMEM: device memory cannot be registered natively");
        }
    }
    if ret != 0 {
        return Err(ret);
    }
    Ok(InfoList(out))
}

/// The providers fi_getinfo reports with no hints, for error messages.
pub(crate) fn available() -> String {
    let mut out: *mut ffi::fi_info = ptr::null_mut();
    // SAFETY: null hints are allowed; the list is freed by InfoList.
    let ret = unsafe { ffi::fi_getinfo(API_VERSION, ptr::null(), ptr::null(), 0, ptr::null_mut(), &mut out) };
    if ret != 0 {
        return format!("none ({})", fi_error(ret));
    }
    let list = InfoList(out);
    let mut names: Vec<String> = Vec::new();
    let mut cur = list.0;
    while !cur.is_null() {
        // SAFETY: walking a list fi_getinfo returned; the strings live as long as the list.
        let name = unsafe {
            let fa = (*cur).fabric_attr;
            if fa.is_null() || (*fa).prov_name.is_null() {
                String::new()
            } else {
                CStr::from_ptr((*fa).prov_name).to_string_lossy().into_owned()
            }
        };
        if !name.is_empty() && !names.contains(&name) {
            names.push(name);
        }
        // SAFETY: as above.
        cur = unsafe { (*cur).next };
    }
    names.join(", ")
}

/// fi_getinfo for the named provider, or a typed error naming what exists instead.
pub(crate) fn select(
    requested: &str,
    node: Option<&str>,
    trust_local: bool,
    hmem: Hmem,
) -> Result<(InfoList, String)> {
    let prov = provider_string(requested);
    // tcp binds to an address; on one host, loopback is the one that always works.
    let node = node.or(if prov.starts_with("tcp") { Some("127.0.0.1") } else { None });
    match getinfo(&prov, node, trust_local, hmem) {
        Ok(list) if !list.0.is_null() => Ok((list, prov)),
        Ok(_) | Err(_) => {
            Err(Error::ProviderUnavailable { backend: "libfabric", requested: prov, found: available() })
        }
    }
}
