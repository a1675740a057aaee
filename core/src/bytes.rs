//! Byte counts as people read them.

use core::fmt;

/// A byte count in the largest binary unit that keeps it readable.
#[derive(Debug, Clone, Copy)]
pub struct Bytes(pub u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
        if self.0 < 1024 {
            return write!(f, "{} B", self.0);
        }
        let mut v = self.0 as f64 / 1024.0;
        let mut unit = 0;
        while v >= 1024.0 && unit + 1 < UNITS.len() {
            v /= 1024.0;
            unit += 1;
        }
        // Round up, so a printed minimum always suffices.
        let rounded = libm::ceil(v * 100.0) / 100.0;
        write!(f, "{rounded:.2} {}", UNITS[unit])
    }
}
