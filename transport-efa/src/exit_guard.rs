//! Process exit against reactor threads still in libfabric. A runtime whose last handle goes
//! on its own reactor thread (a buffer the NIC held, freed by its completion) finishes
//! shutting down in the background; if the process exits meanwhile, libfabric's destructors
//! run under that thread's `fi_close` calls and it crashes. An exit handler, registered once
//! libfabric is in use (so it runs before libfabric's destructors), turns teardown calls made
//! from then on into no-ops (the process is going; the kernel takes everything back) and waits,
//! bounded, for the ones already inside libfabric.
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Once;
use std::time::{Duration, Instant};

static EXITING: AtomicBool = AtomicBool::new(false);
static INSIDE: AtomicUsize = AtomicUsize::new(0);
static REGISTER: Once = Once::new();

/// How long the exit handler waits for teardown calls already in libfabric.
const EXIT_WAIT: Duration = Duration::from_secs(1);

/// Install the exit handler (once per process).
pub(crate) fn install() {
    REGISTER.call_once(|| {
        // SAFETY: `at_exit` is an `extern "C" fn()` that touches only statics and never unwinds.
        if unsafe { libc::atexit(at_exit) } != 0 {
            tracing::debug!("could not register the libfabric exit handler");
        }
    });
}

extern "C" fn at_exit() {
    EXITING.store(true, Ordering::SeqCst);
    let start = Instant::now();
    while INSIDE.load(Ordering::SeqCst) > 0 && start.elapsed() < EXIT_WAIT {
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The process is exiting: stop calling into libfabric (a cheap look for hot paths).
pub(crate) fn exiting() -> bool {
    EXITING.load(Ordering::Relaxed)
}

/// A teardown call into libfabric, counted so the exit handler waits for it; `None` once the
/// process is exiting (skip the call).
pub(crate) struct Teardown(());

impl Teardown {
    pub(crate) fn enter() -> Option<Teardown> {
        // Counted before the look: the exit handler either sees us inside, or we see it.
        INSIDE.fetch_add(1, Ordering::SeqCst);
        if EXITING.load(Ordering::SeqCst) {
            INSIDE.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        Some(Teardown(()))
    }
}

impl Drop for Teardown {
    fn drop(&mut self) {
        INSIDE.fetch_sub(1, Ordering::SeqCst);
    }
}
