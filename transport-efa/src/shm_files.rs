//! Files a dead process left for shm. shm (1.17) backs each endpoint with a shared-memory file
//! named after the process (`/dev/shm/<pid>:<n>:<n>`), and refuses to create one whose owner
//! looks alive ("shm file in use": `fi_enable` fails with EBUSY). A process killed before it
//! closed its endpoints leaves its files behind, and the owner it names is its pid, so a later
//! process that is handed the same pid finds "itself" alive there and cannot open endpoints.
//! Before this process opens its first shm endpoint, any file named with its own pid is such a
//! leftover: it is removed. This assumes what shm itself assumes (its names and its liveness
//! checks are pids): that the processes sharing `/dev/shm` share a pid namespace, and that no
//! other library in this process opened shm endpoints before rdmalane's first.
use std::sync::Once;

/// Remove leftover shm files named with this process's pid, once per process, before its
/// first shm endpoint (later calls do nothing: by then the files are ours).
pub(crate) fn remove_leftovers() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let prefix = format!("{}:", std::process::id());
        let Ok(dir) = std::fs::read_dir("/dev/shm") else {
            return;
        };
        for entry in dir.flatten() {
            let name = entry.file_name();
            let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(&prefix)) else {
                continue;
            };
            if !is_two_numbers(rest) {
                continue;
            }
            match std::fs::remove_file(entry.path()) {
                Ok(()) => tracing::info!(file = ?name, "removed a shm file a dead process with our pid left"),
                Err(e) => tracing::warn!(file = ?name, error = %e, "could not remove a leftover shm file"),
            }
        }
    });
}

/// `<digits>:<digits>`.
fn is_two_numbers(s: &str) -> bool {
    let digits = |p: &str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit());
    s.split_once(':').is_some_and(|(a, b)| digits(a) && digits(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_shm_endpoint_names_match() {
        assert!(is_two_numbers("0:25"));
        assert!(!is_two_numbers("0:"));
        assert!(!is_two_numbers("0:2x"));
        assert!(!is_two_numbers("25"));
        assert!(!is_two_numbers("0:1:2"));
    }

    #[test]
    fn a_leftover_named_with_our_pid_is_removed_and_others_are_kept() {
        let pid = std::process::id();
        let ours = std::path::PathBuf::from(format!("/dev/shm/{pid}:0:4242"));
        let theirs = std::path::PathBuf::from(format!("/dev/shm/{}:0:4242", pid.wrapping_add(1)));
        let unrelated = std::path::PathBuf::from(format!("/dev/shm/{pid}:not-shm"));
        for p in [&ours, &theirs, &unrelated] {
            std::fs::write(p, b"x").unwrap();
        }
        remove_leftovers();
        let (o, t, u) = (ours.exists(), theirs.exists(), unrelated.exists());
        for p in [&theirs, &unrelated] {
            let _ = std::fs::remove_file(p);
        }
        assert!(!o, "{} should be gone", ours.display());
        assert!(t && u, "other processes' files and other names stay");
    }
}
