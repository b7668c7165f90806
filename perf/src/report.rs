//! Results: a readable table, or one JSON object on the last line.
use std::io::Write;
use std::time::{Duration, Instant};

/// One named figure.
pub enum Val {
    F(f64),
    I(u64),
    S(String),
}

/// Print `fields` as a table, or as one JSON line with `--json`.
pub fn print(json: bool, title: &str, fields: &[(&str, Val)]) {
    if json {
        let body: Vec<String> = fields
            .iter()
            .map(|(k, v)| match v {
                Val::F(f) if f.is_finite() => format!("\"{k}\":{f:.3}"),
                Val::F(_) => format!("\"{k}\":null"),
                Val::I(i) => format!("\"{k}\":{i}"),
                Val::S(s) => format!("\"{k}\":\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\"")),
            })
            .collect();
        println!("{{{}}}", body.join(","));
    } else {
        println!("{title}");
        for (k, v) in fields {
            let v = match v {
                Val::F(f) => format!("{f:.3}"),
                Val::I(i) => i.to_string(),
                Val::S(s) => s.clone(),
            };
            println!("  {k:<16} {v}");
        }
    }
}

/// Ticks between two looks at the clock of a [`Progress`].
const TICK_LOOK: u32 = 1024;

/// A progress line on stderr for long runs (not with `--json`).
pub struct Progress {
    on: bool,
    ticks: u32,
    last: Instant,
    total: usize,
}

impl Progress {
    pub fn new(on: bool, total: usize) -> Progress {
        Progress { on, ticks: 0, last: Instant::now(), total }
    }
    /// `done` rounds are over. The clock is read every [`TICK_LOOK`] ticks only: a ping-pong's
    /// client ticks between a reply and its next send, where a read (25 ns on a VM) showed in
    /// its turnaround.
    pub fn tick(&mut self, done: usize) {
        self.ticks = self.ticks.wrapping_add(1);
        if self.on && self.ticks.is_multiple_of(TICK_LOOK) && self.last.elapsed() > Duration::from_secs(1) {
            self.last = Instant::now();
            eprint!("\r  {done}/{} ({:.0}%)", self.total, 100.0 * done as f64 / self.total.max(1) as f64);
            let _ = std::io::stderr().flush();
        }
    }
    pub fn done(&self) {
        if self.on && self.last.elapsed() > Duration::ZERO {
            eprint!("\r");
        }
    }
}
