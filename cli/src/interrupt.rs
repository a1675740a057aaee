//! Ctrl-C. The first one sets a flag that the device checks before each
//! submission, so a run stops at the end of its current block, frees the
//! device as it unwinds, writes nothing, and exits with status 130. A second
//! Ctrl-C ends the process at once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

/// The exit status of an interrupted run (128 + SIGINT, as shells report it).
pub const EXIT_STATUS: u8 = 130;

static FLAG: OnceLock<Arc<AtomicBool>> = OnceLock::new();

/// The flag Ctrl-C sets, with its handler installed the first time.
pub fn flag() -> Arc<AtomicBool> {
    FLAG.get_or_init(|| {
        let flag = Arc::new(AtomicBool::new(false));
        let set = flag.clone();
        // Without a handler (none can be installed) Ctrl-C keeps its default: the process ends.
        let _ = ctrlc::set_handler(move || {
            if set.swap(true, Ordering::SeqCst) {
                std::process::exit(EXIT_STATUS.into());
            }
        });
        flag
    })
    .clone()
}

/// Whether Ctrl-C was pressed.
pub fn requested() -> bool {
    FLAG.get().is_some_and(|f| f.load(Ordering::SeqCst))
}
