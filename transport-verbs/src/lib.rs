//! # rdmalane-verbs
//!
//! The ibverbs backend of rdmalane: reliable-connected (RC) queue pairs on InfiniBand, RoCE
//! (ConnectX) and Soft-RoCE (`rdma_rxe`), through `rdma-sys`.
//!
//! A lane is a pair of RC queue pairs to one peer sharing one completion queue: the *data* QP
//! carries sends, receives, writes and reads; the *notify* QP carries writes with immediate
//! data, whose receive queue holds only the transport's own zero-length receives. Kept apart,
//! a peer's immediate can never consume a receive the application posted for a message.
//!
//! ```no_run
//! let rt = rdmalane::Runtime::builder()
//!     .backend(rdmalane_verbs::Verbs)
//!     .provider("verbs:rxe0")
//!     .build()?;
//! # Ok::<(), rdmalane::Error>(())
//! ```
//!
//! Device selection: the provider string `verbs` (first device, logged), `verbs:NAME`, or
//! `RDMALANE_VERBS_DEVICE`; the port with `RDMALANE_IB_PORT` (1); on Ethernet (RoCE) the GID
//! index with `RDMALANE_GID_INDEX`, by default the first RoCE v2 IPv4 GID the port lists.
mod device;
mod gpu;
mod lane;
mod status;
pub mod transport;

pub use device::{devices, DeviceSpec};
pub use transport::VerbsTransport;

use rdmalane::backend::{Backend, Transport, TransportConfig};
use rdmalane::{Error, OpKind};

/// The verbs [`Backend`]: pass it to `Runtime::builder().backend(..)`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Verbs;

impl Backend for Verbs {
    fn open(&self, config: &TransportConfig) -> rdmalane::Result<Box<dyn Transport>> {
        if config.rails > 1 {
            return Err(Error::invalid(
                OpKind::Open,
                format!(
                    "verbs: {} rails asked for; this backend opens one device (one rail) per runtime",
                    config.rails
                ),
            ));
        }
        let spec = DeviceSpec::parse(config.provider.as_deref())?;
        // A completion channel costs only when armed: `no_costly_wait_object` keeps it.
        Ok(Box::new(VerbsTransport::open(&spec, !config.no_wait_object)?))
    }

    fn accepts(&self, provider: &str) -> bool {
        is_verbs(provider)
    }
}

/// True when `provider` names the verbs backend (`verbs`, `verbs:NAME`).
pub fn is_verbs(provider: &str) -> bool {
    provider == "verbs" || provider.starts_with("verbs:")
}

/// Entry points for the fuzz targets (`fuzz/`); not part of the API.
#[doc(hidden)]
pub mod fuzzing {
    /// Decode a peer's lane address; what decodes must encode back to the same bytes.
    pub fn lane_address(bytes: &[u8]) {
        if let Ok(n) = crate::lane::LaneName::decode(bytes) {
            assert_eq!(n.encode(), bytes, "lane address round trip");
        }
    }
}
