//! Device buffers for the device-memory tests: one trait over the emulated device (a host
//! stand-in on the staging path, everywhere), CUDA memory (the `cuda` feature, on a GPU) and
//! plain registered memory, so the same checks run on each.
use rdmalane::{IoBufMut, RegisteredBuf, Runtime};

/// A buffer the tests fill and read back whatever memory it is.
pub trait TestBuf: IoBufMut + Sized {
    /// What it is, for messages.
    const KIND: &'static str;
    /// `len` zeroed bytes registered with `rt`.
    fn make(rt: &Runtime, len: usize) -> Self;
    /// Write `src` at `at`.
    fn put(&mut self, at: usize, src: &[u8]);
    /// Its bytes.
    fn get(&self) -> Vec<u8>;
}

impl TestBuf for RegisteredBuf {
    const KIND: &'static str = "host";
    fn make(rt: &Runtime, len: usize) -> Self {
        rt.alloc(len).expect("alloc")
    }
    fn put(&mut self, at: usize, src: &[u8]) {
        self[at..at + src.len()].copy_from_slice(src);
    }
    fn get(&self) -> Vec<u8> {
        self.to_vec()
    }
}

impl TestBuf for rdmalane::buf::EmulatedDeviceBuf {
    const KIND: &'static str = "emulated device";
    fn make(rt: &Runtime, len: usize) -> Self {
        rdmalane::buf::EmulatedDeviceBuf::alloc(rt, len).expect("emulated device buffer")
    }
    fn put(&mut self, at: usize, src: &[u8]) {
        self.copy_from_host(at, src).expect("fill");
    }
    fn get(&self) -> Vec<u8> {
        self.to_vec()
    }
}

#[cfg(feature = "cuda")]
impl TestBuf for rdmalane::CudaBuf {
    const KIND: &'static str = "CUDA";
    fn make(rt: &Runtime, len: usize) -> Self {
        rt.alloc_cuda(0, len).expect("CUDA buffer")
    }
    fn put(&mut self, at: usize, src: &[u8]) {
        self.copy_from_host(at, src).expect("fill");
    }
    fn get(&self) -> Vec<u8> {
        self.to_vec().expect("copy back")
    }
}
