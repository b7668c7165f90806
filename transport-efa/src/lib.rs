//! # rdmalane-efa
//!
//! The libfabric backend of rdmalane: FI_EP_RDM endpoints on `efa` in production and on
//! `tcp;ofi_rxm` and `shm` anywhere. Bindings are generated at build time from the system
//! headers (see `build.rs`); symbols newer than Debian 12's 1.17 are gated on `fi_X_Y` cfgs.
//!
//! ```no_run
//! let rt = rdmalane::Runtime::builder()
//!     .backend(rdmalane_efa::Libfabric)
//!     .provider("shm")
//!     .build()?;
//! # Ok::<(), rdmalane::Error>(())
//! ```
mod exit_guard;
mod fabric;
mod ffi;
mod info;
mod probe;
#[cfg(feature = "raw")]
pub mod raw;
mod shm_files;
mod shm_peers;
mod spacing;
mod util;

pub use fabric::FabricTransport;
pub use info::provider_string;
/// Where the provider's calls and the caller's turnaround spent their time (the `probe`
/// feature; `rdmalane-perf lat` reports it).
#[cfg(feature = "probe")]
pub use probe::{snapshot as probe_snapshot, Probe, Tally};

use rdmalane::backend::{Backend, Transport, TransportConfig};

/// The libfabric version the bindings were generated from.
pub const HEADER_VERSION: &str = env!("RDMALANE_FI_HEADER_VERSION");

/// The libfabric [`Backend`]: pass it to `Runtime::builder().backend(..)`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Libfabric;

impl Backend for Libfabric {
    fn open(&self, config: &TransportConfig) -> rdmalane::Result<Box<dyn Transport>> {
        let ids: Vec<usize> = if config.rail_ids.is_empty() {
            (0..config.rails.max(1)).collect()
        } else {
            config.rail_ids.clone()
        };
        let nodes: Vec<Option<String>> = ids
            .iter()
            .map(|&id| {
                config.rail_nodes.get(id).cloned().or(if id == 0 { config.node.clone() } else { None })
            })
            .collect();
        let mut t = FabricTransport::open_rails(
            config.provider.as_deref(),
            &nodes,
            &ids,
            // FI_WAIT_FD costs on the busy path (see `TransportConfig::no_costly_wait_object`).
            !config.no_wait_object && !config.no_costly_wait_object,
            config.trust_local_peers,
            config.device_memory,
            config.device_early_completion,
        )?;
        t.space_polls(config.poll_spacing);
        Ok(Box::new(t))
    }

    fn accepts(&self, provider: &str) -> bool {
        // Everything but another backend's names: libfabric takes full provider strings.
        provider != "verbs" && !provider.starts_with("verbs:")
    }
}
