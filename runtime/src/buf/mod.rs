//! Memory the NIC may touch: registered buffers, slices of them, regions exposed to peers, and
//! the few calls that hand raw addresses to a transport. All of rdmalane's `unsafe` outside the
//! transport crates lives here.
mod cache;
mod exposed;
mod iobuf;
pub(crate) mod lease;
mod registered;
mod slice;

pub use cache::{CacheStats, SharedBuf};
pub use exposed::ExposedBuf;
pub use iobuf::{IoBuf, IoBufMut};
pub use registered::RegisteredBuf;
pub use slice::Slice;
