//! The cell an op's future and the reactor share. The reactor writes the outcome once and wakes
//! the future; the future reads it. A success travels in atomics, so the common path takes no
//! lock; an error, and the buffer of a future dropped while its op is posted, sit behind a lock
//! only those rare paths take. The buffer itself stays in the future while the future lives
//! (tokio-uring's lifecycle): the cell holds it only once the future is gone ("Ignored").
use std::any::Any;
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Waker;

use futures::task::AtomicWaker;

use crate::error::Error;

/// What a finished op reports besides its buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Done {
    pub len: usize,
    pub imm: Option<u64>,
}

const PENDING: u8 = 0;
const OK: u8 = 1;
const OK_IMM: u8 = 2;
const FAILED: u8 = 3;

pub(crate) struct OpCell {
    state: AtomicU8,
    len: AtomicUsize,
    imm: AtomicU64,
    waker: AtomicWaker,
    rare: Mutex<Rare>,
}

#[derive(Default)]
struct Rare {
    error: Option<Error>,
    /// The buffer of a future dropped while its op was posted: freed with the cell, that is
    /// once the reactor has let go of the op (its completion arrived, or it was withdrawn).
    orphan: Option<Box<dyn Any + Send>>,
}

impl OpCell {
    pub(crate) fn new() -> Arc<OpCell> {
        Arc::new(OpCell {
            state: AtomicU8::new(PENDING),
            len: AtomicUsize::new(0),
            imm: AtomicU64::new(0),
            waker: AtomicWaker::new(),
            rare: Mutex::new(Rare::default()),
        })
    }

    fn rare(&self) -> std::sync::MutexGuard<'_, Rare> {
        self.rare.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Record the outcome and wake the future: once, by the reactor (or by the submitting
    /// thread when the runtime refuses the op).
    pub(crate) fn complete(&self, res: Result<Done, Error>) {
        let state = match res {
            Ok(Done { len, imm }) => {
                self.len.store(len, Ordering::Relaxed);
                match imm {
                    Some(v) => {
                        self.imm.store(v, Ordering::Relaxed);
                        OK_IMM
                    }
                    None => OK,
                }
            }
            Err(e) => {
                self.rare().error = Some(e);
                FAILED
            }
        };
        // Release: whoever sees the state sees the fields written before it.
        self.state.store(state, Ordering::Release);
        self.waker.wake();
    }

    /// The outcome, once there. Read once by the future that owns the op (an error moves out).
    pub(crate) fn outcome(&self) -> Option<Result<Done, Error>> {
        let imm = match self.state.load(Ordering::Acquire) {
            PENDING => return None,
            OK => None,
            OK_IMM => Some(self.imm.load(Ordering::Relaxed)),
            _ => {
                let e = self.rare().error.take().expect("an op's outcome is read once");
                return Some(Err(e));
            }
        };
        Some(Ok(Done { len: self.len.load(Ordering::Relaxed), imm }))
    }

    /// Has the outcome been recorded?
    pub(crate) fn is_done(&self) -> bool {
        self.state.load(Ordering::Acquire) != PENDING
    }

    /// Wake `w` when the outcome is recorded. Look at the outcome after this: it may have come
    /// in between.
    pub(crate) fn register(&self, w: &Waker) {
        self.waker.register(w);
    }

    /// Keep the buffer of a future dropped while its op is posted until the reactor lets go.
    pub(crate) fn orphan(&self, buf: Box<dyn Any + Send>) {
        self.rare().orphan = Some(buf);
    }
}
