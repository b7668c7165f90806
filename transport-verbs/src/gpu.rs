//! Device memory on verbs: `ibv_reg_dmabuf_mr` from a CUDA dma-buf export (kernel 5.12 and
//! rdma-core 34 on), else a plain `ibv_reg_mr` of the device address, which the NIC can only
//! reach when nvidia-peermem is loaded. What the host has is read once, when the transport
//! opens. (rdma-sys does not bind `ibv_reg_dmabuf_mr`: it is declared here; libibverbs
//! exports it.)
use rdmalane::backend::DeviceRegistration;

extern "C" {
    /// rdma-core's `ibv_reg_dmabuf_mr` (infiniband/verbs.h).
    pub(crate) fn ibv_reg_dmabuf_mr(
        pd: *mut rdma_sys::ibv_pd,
        offset: u64,
        length: usize,
        iova: u64,
        fd: i32,
        access: i32,
    ) -> *mut rdma_sys::ibv_mr;
}

/// How this host lets verbs register device memory.
pub(crate) fn registration() -> DeviceRegistration {
    let dmabuf = kernel_at_least(5, 12);
    let peermem = std::path::Path::new("/sys/module/nvidia_peermem").exists();
    DeviceRegistration::Verbs { dmabuf, peermem }
}

/// Whether the running kernel is `major.minor` or newer.
fn kernel_at_least(major: u32, minor: u32) -> bool {
    let Ok(r) = std::fs::read_to_string("/proc/sys/kernel/osrelease") else { return false };
    let mut parts = r.trim().split(['.', '-']).map(|p| p.parse::<u32>().unwrap_or(0));
    let (ma, mi) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (ma, mi) >= (major, minor)
}
