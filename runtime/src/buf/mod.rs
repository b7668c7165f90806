//! Memory the NIC may touch: registered buffers, slices of them, regions exposed to peers, and
//! the few calls that hand raw addresses to a transport. All of rdmalane's `unsafe` outside the
//! transport crates lives here.
mod cache;
#[cfg(feature = "cuda")]
mod cuda;
#[cfg(feature = "emulated-device")]
mod emulated;
mod exposed;
mod iobuf;
pub(crate) mod lease;
mod registered;
mod slice;
pub(crate) mod staging;

pub use cache::{CacheStats, SharedBuf};
#[cfg(feature = "cuda")]
pub use cuda::CudaBuf;
#[cfg(feature = "emulated-device")]
#[doc(hidden)]
pub use emulated::EmulatedDeviceBuf;
pub use exposed::ExposedBuf;
pub use iobuf::{IoBuf, IoBufMut};
pub use registered::RegisteredBuf;
pub use slice::Slice;
#[doc(hidden)]
pub use staging::StagedView;
