//! Which device, port and GID to use, and opening them.
use std::ffi::CStr;

use rdma_sys::{ibv_context, ibv_gid};
use rdmalane::{Error, OpKind, Result};

/// `ibv_port_attr::link_layer` for Ethernet (RoCE); InfiniBand is 1.
const LINK_LAYER_ETHERNET: u8 = 2;

/// What to open: a device by name (or the first), a port, a GID index (or the default).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceSpec {
    /// Device name as `ibv_devices` lists it (`mlx5_0`, `rxe0`); `None`: the first device.
    pub name: Option<String>,
    /// Port number, from 1.
    pub port: u8,
    /// GID index; `None`: the first RoCE v2 IPv4 GID on Ethernet ports, 0 on InfiniBand.
    pub gid_index: Option<u8>,
}

impl DeviceSpec {
    /// Read `verbs`, `verbs:NAME` (or `None`), then `RDMALANE_VERBS_DEVICE`,
    /// `RDMALANE_IB_PORT` and `RDMALANE_GID_INDEX` for what the string leaves open.
    pub fn parse(provider: Option<&str>) -> Result<DeviceSpec> {
        let name = match provider {
            None | Some("verbs") => None,
            Some(p) => match p.strip_prefix("verbs:") {
                Some(n) if !n.is_empty() => Some(n.to_string()),
                _ => {
                    return Err(Error::invalid(
                        OpKind::Open,
                        format!("verbs backend: provider '{p}' is not 'verbs' or 'verbs:DEVICE'"),
                    ))
                }
            },
        };
        let name = name.or_else(|| std::env::var("RDMALANE_VERBS_DEVICE").ok().filter(|s| !s.is_empty()));
        let num = |var: &str| -> Result<Option<u8>> {
            match std::env::var(var) {
                Ok(v) => v.trim().parse::<u8>().map(Some).map_err(|_| {
                    Error::invalid(OpKind::Open, format!("{var}={v:?} is not a number from 0 to 255"))
                }),
                Err(_) => Ok(None),
            }
        };
        let port = num("RDMALANE_IB_PORT")?.unwrap_or(1);
        if port == 0 {
            return Err(Error::invalid(OpKind::Open, "RDMALANE_IB_PORT: ports are numbered from 1"));
        }
        Ok(DeviceSpec { name, port, gid_index: num("RDMALANE_GID_INDEX")? })
    }
}

/// Names of the verbs devices on this host (empty where the kernel has no RDMA).
pub fn devices() -> Vec<String> {
    let mut n = 0;
    // SAFETY: the list is read, then freed once; names are copied out before.
    unsafe {
        let list = rdma_sys::ibv_get_device_list(&mut n);
        if list.is_null() {
            return Vec::new();
        }
        let names = (0..n.max(0) as usize)
            .map(|i| {
                CStr::from_ptr(rdma_sys::ibv_get_device_name(*list.add(i))).to_string_lossy().into_owned()
            })
            .collect();
        rdma_sys::ibv_free_device_list(list);
        names
    }
}

/// An open device with the port facts lanes need.
pub(crate) struct Device {
    pub(crate) ctx: *mut ibv_context,
    pub(crate) name: String,
    pub(crate) port: u8,
    pub(crate) lid: u16,
    pub(crate) gid: ibv_gid,
    pub(crate) gid_index: u8,
    /// Ethernet (RoCE): addressing by GID; InfiniBand: by LID.
    pub(crate) roce: bool,
    pub(crate) active_mtu: u32,
    /// Largest message the port carries.
    pub(crate) max_msg: usize,
}

fn open_err(text: String) -> Error {
    Error::invalid(OpKind::Open, text)
}

impl Device {
    pub(crate) fn open(spec: &DeviceSpec) -> Result<Device> {
        let mut n = 0;
        // SAFETY: reading the device list, opening one entry before the list is freed (an open
        // context does not depend on the list).
        let (ctx, name) = unsafe {
            let list = rdma_sys::ibv_get_device_list(&mut n);
            if list.is_null() || n <= 0 {
                if !list.is_null() {
                    rdma_sys::ibv_free_device_list(list);
                }
                return Err(open_err(
                    "verbs: no RDMA device on this host (ibv_get_device_list is empty): the kernel has no \
                     RDMA driver loaded; on a machine without a NIC run the suite in the Soft-RoCE VM \
                     (scripts/softroce-vm.sh)"
                        .into(),
                ));
            }
            let all: Vec<(String, *mut rdma_sys::ibv_device)> = (0..n as usize)
                .map(|i| {
                    let d = *list.add(i);
                    (CStr::from_ptr(rdma_sys::ibv_get_device_name(d)).to_string_lossy().into_owned(), d)
                })
                .collect();
            let pick = match &spec.name {
                Some(want) => all.iter().find(|(name, _)| name == want),
                None => all.first(),
            };
            let Some((name, dev)) = pick.cloned() else {
                rdma_sys::ibv_free_device_list(list);
                let names: Vec<&str> = all.iter().map(|(n, _)| n.as_str()).collect();
                return Err(open_err(format!(
                    "verbs: no device named '{}' (found: {})",
                    spec.name.as_deref().unwrap_or(""),
                    names.join(", ")
                )));
            };
            let ctx = rdma_sys::ibv_open_device(dev);
            rdma_sys::ibv_free_device_list(list);
            if ctx.is_null() {
                return Err(open_err(format!(
                    "verbs: ibv_open_device({name}): {}",
                    std::io::Error::last_os_error()
                )));
            }
            (ctx, name)
        };
        if spec.name.is_none() {
            tracing::info!(device = %name, "verbs: no device named: chose the first");
        }
        let mut d = Device {
            ctx,
            name,
            port: spec.port,
            lid: 0,
            // SAFETY: an all-zero GID is a valid value of this plain union.
            gid: unsafe { std::mem::zeroed() },
            gid_index: 0,
            roce: false,
            active_mtu: 0,
            max_msg: 0,
        };
        // SAFETY: a zeroed ibv_port_attr is a valid out-parameter.
        let mut pa: rdma_sys::ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: querying a port of our open context into a local struct.
        let r = unsafe { rdma_sys::___ibv_query_port(ctx, spec.port, &mut pa) };
        if r != 0 {
            return Err(open_err(format!("verbs: {}: ibv_query_port({}): errno {r}", d.name, spec.port)));
        }
        if pa.state != rdma_sys::ibv_port_state::IBV_PORT_ACTIVE {
            return Err(open_err(format!(
                "verbs: {} port {} is not active (state {})",
                d.name, spec.port, pa.state
            )));
        }
        d.lid = pa.lid;
        d.roce = pa.link_layer == LINK_LAYER_ETHERNET;
        d.active_mtu = pa.active_mtu;
        d.max_msg = pa.max_msg_sz as usize;
        d.gid_index = match spec.gid_index {
            Some(i) => i,
            None if d.roce => default_gid_index(&d.name, spec.port, pa.gid_tbl_len).ok_or_else(|| {
                open_err(format!(
                    "verbs: {} port {}: no RoCE v2 GID found; set RDMALANE_GID_INDEX (see show_gids)",
                    d.name, spec.port
                ))
            })?,
            None => 0,
        };
        // SAFETY: querying a GID of our open context into the struct's field.
        let r = unsafe { rdma_sys::ibv_query_gid(ctx, spec.port, d.gid_index as i32, &mut d.gid) };
        if r != 0 {
            return Err(open_err(format!(
                "verbs: {} port {}: ibv_query_gid(index {}) failed (errno {r}): no such GID",
                d.name, spec.port, d.gid_index
            )));
        }
        Ok(d)
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: closing the context we opened, once, after everything made from it.
        unsafe { rdma_sys::ibv_close_device(self.ctx) };
    }
}

/// The first GID of type RoCE v2 holding an IPv4-mapped address (what rdma_cm picks and what
/// routes across subnets), else the first RoCE v2 GID; from sysfs.
fn default_gid_index(dev: &str, port: u8, len: i32) -> Option<u8> {
    let base = format!("/sys/class/infiniband/{dev}/ports/{port}");
    let mut any_v2 = None;
    for i in 0..len.clamp(0, 256) {
        let ty = std::fs::read_to_string(format!("{base}/gid_attrs/types/{i}")).unwrap_or_default();
        if !ty.trim().eq_ignore_ascii_case("RoCE v2") {
            continue;
        }
        let gid = std::fs::read_to_string(format!("{base}/gids/{i}")).unwrap_or_default();
        if gid.trim().starts_with("0000:0000:0000:0000:0000:ffff:") {
            return u8::try_from(i).ok();
        }
        any_v2 = any_v2.or(u8::try_from(i).ok());
    }
    any_v2
}
