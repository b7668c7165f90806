//! Where a buffer's bytes live, and how a transport can register device memory: the words the
//! buffer module, the runtime and the backends share about GPU memory.

/// Where a buffer's bytes live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Memory {
    /// Ordinary host memory.
    #[default]
    Host,
    /// CUDA device memory on device `device` (its ordinal).
    Cuda {
        /// The device ordinal.
        device: u32,
    },
}

impl Memory {
    /// True for device (GPU) memory.
    pub fn is_device(self) -> bool {
        !matches!(self, Memory::Host)
    }

    /// The kind as one byte on the wire (a descriptor carries it).
    pub(crate) fn to_byte(self) -> (u8, u32) {
        match self {
            Memory::Host => (0, 0),
            Memory::Cuda { device } => (1, device),
        }
    }

    /// The kind a descriptor's byte and device word name; `None` for a kind this build does not
    /// know.
    pub(crate) fn from_byte(kind: u8, device: u32) -> Option<Memory> {
        match kind {
            0 => Some(Memory::Host),
            1 => Some(Memory::Cuda { device }),
            _ => None,
        }
    }
}

impl std::fmt::Display for Memory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Memory::Host => f.write_str("host memory"),
            Memory::Cuda { device } => write!(f, "CUDA device {device} memory"),
        }
    }
}

/// How a transport registers device memory itself (so the NIC or the provider reaches it with
/// no copy through the host), read once when it opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceRegistration {
    /// It cannot: device memory goes through the runtime's staging path, or is refused.
    #[default]
    None,
    /// libfabric with FI_HMEM: registered with the CUDA interface and device (`fi_mr_regattr`).
    FiHmem {
        /// The provider takes a dma-buf file descriptor (FI_MR_DMABUF, libfabric 1.20 and up).
        dmabuf: bool,
        /// Registrations are marked device-only (FI_HMEM_DEVICE_ONLY, where the headers have
        /// it): the provider need not look up the memory's kind per op.
        device_only: bool,
        /// The provider reports device-memory ops complete before their copies land (shm's
        /// CUDA IPC path): a completion or immediate event does not mean the bytes are there,
        /// so [`DevicePolicy::Auto`] stages instead; only [`DevicePolicy::Native`] takes it.
        early_completion: bool,
    },
    /// verbs: `ibv_reg_dmabuf_mr` from the CUDA dma-buf handle (kernel 5.12 and up), else a
    /// plain registration of the device address, which nvidia-peermem resolves.
    Verbs {
        /// The kernel and rdma-core have dma-buf registration.
        dmabuf: bool,
        /// nvidia-peermem is loaded.
        peermem: bool,
    },
}

impl DeviceRegistration {
    /// True when device memory can be registered at all.
    pub fn is_some(self) -> bool {
        !matches!(self, DeviceRegistration::None)
    }
}

impl std::fmt::Display for DeviceRegistration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceRegistration::None => f.write_str("none"),
            DeviceRegistration::FiHmem { early_completion: true, .. } => {
                f.write_str("FI_HMEM (completes before its copies land)")
            }
            DeviceRegistration::FiHmem { dmabuf: true, .. } => f.write_str("FI_HMEM (dma-buf)"),
            DeviceRegistration::FiHmem { .. } => f.write_str("FI_HMEM"),
            DeviceRegistration::Verbs { dmabuf: true, .. } => f.write_str("verbs dma-buf"),
            DeviceRegistration::Verbs { peermem: true, .. } => f.write_str("verbs nvidia-peermem"),
            DeviceRegistration::Verbs { .. } => f.write_str("verbs (neither dma-buf nor peermem)"),
        }
    }
}

/// Device memory handed to [`Transport::register_device`](crate::base::transport::Transport::register_device).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceMem {
    /// Which memory it is.
    pub memory: Memory,
    /// A dma-buf file descriptor exporting it, and the offset of the region's first byte in it,
    /// where the runtime could get one (the transport does not close it).
    pub dmabuf: Option<DmaBuf>,
}

/// A dma-buf export of device memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DmaBuf {
    /// The file descriptor.
    pub fd: i32,
    /// Offset of the region's first byte within the exported range.
    pub offset: u64,
}

/// How a runtime moves the bytes of one device buffer, decided when the buffer is registered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DevicePath {
    /// The transport registered the device memory itself: ops read and write it in place.
    Native(DeviceRegistration),
    /// Through a registered, pinned host mirror of the buffer: a write copies device to mirror
    /// then sends from it, chunk after chunk, each chunk's copy overlapping the previous
    /// chunk's transfer; a read lands in the mirror and is copied up chunk by chunk.
    Staged,
}

impl std::fmt::Display for DevicePath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DevicePath::Native(r) => write!(f, "native ({r})"),
            DevicePath::Staged => f.write_str("staged through pinned host memory"),
        }
    }
}

/// Which path a runtime may take for device memory
/// ([`Builder::device_memory`](crate::Builder::device_memory), `RDMALANE_DEVICE_MEMORY`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DevicePolicy {
    /// Native where the transport can register device memory and its completions mean the
    /// bytes are there, staged elsewhere (the default).
    #[default]
    Auto,
    /// Native only: device memory on a transport that cannot register it is refused. Taken even
    /// where the provider completes before its copies land (shm's CUDA IPC): there the
    /// application must make sure of the bytes itself.
    Native,
    /// Staged always, even where the transport could register device memory.
    Staged,
    /// No device memory: the transport is not asked for it (FI_HMEM is left out of the hints),
    /// and device buffers are refused.
    Off,
}

impl DevicePolicy {
    /// The path a buffer takes on a transport that registers device memory as `reg`, or why
    /// none (what the transport lacks).
    pub(crate) fn path(self, reg: DeviceRegistration) -> Result<DevicePath, &'static str> {
        let early = matches!(reg, DeviceRegistration::FiHmem { early_completion: true, .. });
        match (self, reg.is_some()) {
            (DevicePolicy::Off, _) => Err("device memory is off (DevicePolicy::Off)"),
            (DevicePolicy::Auto, true) if early => Ok(DevicePath::Staged),
            (DevicePolicy::Staged, _) | (DevicePolicy::Auto, false) => Ok(DevicePath::Staged),
            (DevicePolicy::Native | DevicePolicy::Auto, true) => Ok(DevicePath::Native(reg)),
            (DevicePolicy::Native, false) => {
                Err("the transport cannot register device memory (no FI_HMEM, dma-buf or peermem)")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_picks_the_path_the_transport_allows() {
        let hmem = DeviceRegistration::FiHmem { dmabuf: false, device_only: true, early_completion: false };
        let none = DeviceRegistration::None;
        let shm = DeviceRegistration::FiHmem { dmabuf: false, device_only: true, early_completion: true };
        assert_eq!(DevicePolicy::Auto.path(shm), Ok(DevicePath::Staged), "early completions: staged");
        assert_eq!(DevicePolicy::Native.path(shm), Ok(DevicePath::Native(shm)), "unless asked");
        assert_eq!(DevicePolicy::Auto.path(hmem), Ok(DevicePath::Native(hmem)));
        assert_eq!(DevicePolicy::Auto.path(none), Ok(DevicePath::Staged));
        assert_eq!(DevicePolicy::Staged.path(hmem), Ok(DevicePath::Staged));
        assert!(DevicePolicy::Native.path(none).unwrap_err().contains("FI_HMEM"));
        assert!(DevicePolicy::Off.path(hmem).is_err());
    }

    #[test]
    fn the_kind_survives_the_wire() {
        for m in [Memory::Host, Memory::Cuda { device: 0 }, Memory::Cuda { device: 7 }] {
            let (k, d) = m.to_byte();
            assert_eq!(Memory::from_byte(k, d), Some(m));
        }
        assert_eq!(Memory::from_byte(9, 0), None);
    }
}
