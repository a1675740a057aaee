//! The process's own memory as the OS counts it, for `gen --verbose` and
//! for the tests that hold a run to its plan. On unified-memory machines
//! (Apple Silicon, and lavapipe, whose device memory is host memory) the
//! anonymous figure includes the device's buffers.
//!
//! Linux reads `/proc/self/status`; macOS asks the kernel for the
//! process's footprint (`proc_pid_rusage`, the figure Activity Monitor
//! shows, which holds Metal buffers too); elsewhere every figure is `None`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// One reading of the process's memory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostMemory {
    /// The process's own memory now: heap, device buffers of a software or
    /// unified-memory driver; not the mapped weight files. Linux: resident
    /// anonymous memory (`RssAnon`); macOS: the physical footprint.
    pub anonymous: u64,
    /// The most memory so far. Linux: resident, mapped files' pages
    /// included (`VmHWM`); macOS: the largest physical footprint.
    pub resident_peak: u64,
}

/// What [`HostMemory`]'s two figures are on this OS, in words.
pub const FIGURES: (&str, &str) = if cfg!(target_os = "macos") {
    ("physical footprint", "largest footprint")
} else {
    ("anonymous", "resident with mapped files")
};

/// The process's memory now, where the OS tells it.
#[cfg(target_os = "linux")]
pub fn now() -> Option<HostMemory> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    parse_status(&status)
}

/// The process's memory now, where the OS tells it.
#[cfg(target_os = "macos")]
pub fn now() -> Option<HostMemory> {
    let mut info = std::mem::MaybeUninit::<libc::rusage_info_v4>::zeroed();
    // SAFETY: for RUSAGE_INFO_V4 the kernel writes one `rusage_info_v4` of
    // this process into the buffer, which is that size and zeroed.
    let rc = unsafe { libc::proc_pid_rusage(libc::getpid(), libc::RUSAGE_INFO_V4, info.as_mut_ptr().cast()) };
    if rc != 0 {
        return None;
    }
    // SAFETY: zeroed, then written by the kernel: every field is a plain integer.
    let info = unsafe { info.assume_init() };
    Some(HostMemory { anonymous: info.ri_phys_footprint, resident_peak: info.ri_lifetime_max_phys_footprint })
}

/// The process's memory now, where the OS tells it.
#[cfg(not(any(target_os = "linux", target_os = "macos")))]
pub fn now() -> Option<HostMemory> {
    None
}

/// `RssAnon` and `VmHWM` of a `/proc/<pid>/status` text, in bytes.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
fn parse_status(status: &str) -> Option<HostMemory> {
    let field = |name: &str| -> Option<u64> {
        let line = status.lines().find(|l| l.starts_with(name))?;
        let kib: u64 = line[name.len()..].trim().trim_end_matches("kB").trim().parse().ok()?;
        Some(kib * 1024)
    };
    Some(HostMemory { anonymous: field("RssAnon:")?, resident_peak: field("VmHWM:")? })
}

/// Returns the heap's free memory to the OS where the C library keeps it
/// (glibc holds freed blocks below its mmap threshold, which rises to 32
/// MiB as large blocks are freed, e.g. a software driver's buffers): called
/// between phases, so that one phase's freed memory is not held through the
/// next. Elsewhere it does nothing.
pub fn give_back_freed() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own free lists; it
    // takes no pointers and is thread-safe.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Samples the anonymous memory on a thread of its own every `PERIOD` and
/// keeps the largest reading, overall and since the current phase began:
/// the OS keeps no high-water of anonymous memory alone, so a peak shorter
/// than the period can be missed.
#[derive(Debug)]
pub struct AnonymousPeak {
    stop: Arc<AtomicBool>,
    /// `[overall, this phase]`.
    peaks: Arc<[AtomicU64; 2]>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl AnonymousPeak {
    pub const PERIOD: Duration = Duration::from_millis(5);

    /// Starts sampling; `None` where the OS does not tell.
    pub fn start() -> Option<Self> {
        let first = now()?;
        let stop = Arc::new(AtomicBool::new(false));
        let peaks = Arc::new([AtomicU64::new(first.anonymous), AtomicU64::new(first.anonymous)]);
        let thread = {
            let (stop, peaks) = (stop.clone(), peaks.clone());
            std::thread::Builder::new()
                .name("host memory".into())
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        if let Some(m) = now() {
                            for p in peaks.iter() {
                                p.fetch_max(m.anonymous, Ordering::Relaxed);
                            }
                        }
                        std::thread::sleep(Self::PERIOD);
                    }
                })
                .ok()?
        };
        Some(Self { stop, peaks, thread: Some(thread) })
    }

    /// Starts a new phase: returns the largest reading of the one before
    /// (this one included) and this reading, the new one's start.
    pub fn next_phase(&self) -> (u64, u64) {
        let reading = now().map_or(0, |m| m.anonymous);
        self.peaks[0].fetch_max(reading, Ordering::Relaxed);
        (self.peaks[1].swap(reading, Ordering::Relaxed).max(reading), reading)
    }

    /// Stops sampling; the largest anonymous reading, the last one included.
    pub fn finish(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Some(m) = now() {
            self.peaks[0].fetch_max(m.anonymous, Ordering::Relaxed);
        }
        self.peaks[0].load(Ordering::Relaxed)
    }
}

impl Drop for AnonymousPeak {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Held by every test that measures the process's memory: tests run on
/// threads of one process, so one test's allocations would show in
/// another's figures.
#[cfg(test)]
pub(crate) fn measuring_alone() -> std::sync::MutexGuard<'static, ()> {
    static MEASURING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    MEASURING.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_fields_in_bytes() {
        let text = "Name:\tx\nVmHWM:\t  204800 kB\nVmRSS:\t  102400 kB\nRssAnon:\t   51200 kB\nRssFile:\t 51200 kB\n";
        assert_eq!(parse_status(text), Some(HostMemory { anonymous: 50 << 20, resident_peak: 200 << 20 }));
        assert_eq!(parse_status("Name:\tx\n"), None);
    }

    /// A sampler started, and the anonymous memory before a block of 64 MiB
    /// was touched, held for several periods and freed (a block this large
    /// goes back to the OS); `None` where the OS does not tell.
    fn sampled_block() -> Option<(AnonymousPeak, u64)> {
        let Some(sampler) = AnonymousPeak::start() else {
            flux_lite_kernels::skip::skipped("this OS does not report anonymous memory (no /proc/self/status)");
            return None;
        };
        let before = now()?.anonymous;
        let block = vec![1u8; 64 << 20];
        std::thread::sleep(AnonymousPeak::PERIOD * 8);
        assert_eq!(block.iter().map(|&b| b as u64).sum::<u64>(), 64 << 20);
        drop(block);
        Some((sampler, before))
    }

    #[test]
    fn the_sampler_sees_a_large_allocation() {
        let _alone = measuring_alone();
        let Some((sampler, before)) = sampled_block() else { return };
        let peak = sampler.finish();
        assert!(peak >= before + (60 << 20), "peak {peak}, before {before}");
    }

    #[test]
    fn each_phase_has_its_own_peak_and_the_overall_one_keeps_them_all() {
        let _alone = measuring_alone();
        // The block in the first phase, freed before the second starts.
        let Some((sampler, before)) = sampled_block() else { return };
        let (first, _) = sampler.next_phase();
        std::thread::sleep(AnonymousPeak::PERIOD * 8);
        let (second, _) = sampler.next_phase();
        let overall = sampler.finish();
        assert!(first >= before + (60 << 20), "first phase {first}, before {before}");
        assert!(second < before + (32 << 20), "second phase {second}, before {before}: the first phase's block leaked into it");
        assert!(overall >= first, "overall {overall} below the first phase's {first}");
    }
}
