//! Waking a task from the reactor's thread. A waker is the executor's code, run in the middle
//! of a batch of completions: its panic must not unwind through the reactor and lose the rest
//! of the batch (their ops, or the immediate events behind them, would wait for good). Each
//! outcome is recorded before its wake, so a task whose waker panicked still finds it when it
//! is polled again.
use std::task::Waker;

/// Wake `w`, catching and logging a panic.
pub(crate) fn wake_guarded(w: Waker) {
    if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| w.wake())) {
        tracing::error!("a waker panicked on the reactor's thread: {}", panic_text(&*p));
    }
}

/// A caught panic's message, where it has one (`panic!` with a literal or a format).
pub(crate) fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    match (p.downcast_ref::<&str>(), p.downcast_ref::<String>()) {
        (Some(s), _) => (*s).to_owned(),
        (_, Some(s)) => s.clone(),
        _ => "no message".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    struct Bad;
    impl std::task::Wake for Bad {
        fn wake(self: Arc<Self>) {
            panic!("an executor with a bug");
        }
    }

    struct Good(AtomicBool);
    impl std::task::Wake for Good {
        fn wake(self: Arc<Self>) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_panicking_waker_does_not_stop_the_wakes_after_it() {
        let good = Arc::new(Good(AtomicBool::new(false)));
        let wakers = [Waker::from(Arc::new(Bad)), Waker::from(good.clone())];
        wakers.into_iter().for_each(wake_guarded);
        assert!(good.0.load(Ordering::SeqCst));
    }
}
