//! `gen`'s observer: the progress bar, the preview file, and each phase's
//! host high-water where measured.

use crate::progress::Bar;
use flux_lite_platform::host_memory::AnonymousPeak;
use flux_lite_platform::pipeline::image_file::{encode_image, ImageFormat};
use flux_lite_platform::pipeline::output;
use flux_lite_platform::{Observer, Phase, Preview, Progress};
use std::path::Path;

pub struct Watch<'a> {
    pub bar: &'a mut Bar,
    /// `--preview FILE` and every how many steps, when asked.
    pub preview: Option<(&'a Path, usize)>,
    pub sampler: Option<&'a AnonymousPeak>,
    /// Each phase that ran: its start's and its peak's readings.
    phases: Vec<(Phase, u64, u64)>,
    /// The running phase and its start's reading.
    current: Option<(Phase, u64)>,
}

impl<'a> Watch<'a> {
    pub fn new(bar: &'a mut Bar, preview: Option<(&'a Path, usize)>, sampler: Option<&'a AnonymousPeak>) -> Self {
        Self { bar, preview, sampler, phases: Vec::new(), current: None }
    }

    /// Each phase that ran with its start's reading and its high-water.
    pub fn finish(mut self) -> Vec<(Phase, u64, u64)> {
        self.close_phase();
        self.phases
    }

    /// Ends the running phase; returns the reading the next one starts from.
    fn close_phase(&mut self) -> u64 {
        let Some(sampler) = self.sampler else { return 0 };
        let (peak, now) = sampler.next_phase();
        if let Some((phase, start)) = self.current.take() {
            self.phases.push((phase, start, peak));
        }
        now
    }
}

impl Observer for Watch<'_> {
    fn phase(&mut self, phase: Phase) {
        let start = self.close_phase();
        self.current = Some((phase, start));
    }

    fn progress(&mut self, p: Progress) {
        self.bar.progress(p);
    }

    fn warning(&mut self, message: &str) {
        self.bar.warning(message);
    }

    fn image(&mut self, index: usize, count: usize) {
        self.bar.image(index, count);
    }

    fn previews(&self) -> Option<usize> {
        self.preview.map(|(_, every)| every)
    }

    /// Rewrites the preview file atomically (a reader never sees half a PNG);
    /// a failed write is a warning, the run goes on.
    fn preview(&mut self, p: &Preview<'_>) {
        let Some((path, _)) = self.preview else { return };
        let text = [("Preview", format!("step {} of {}", p.step, p.steps))];
        // The format its name asks for (checked before the run).
        let format = ImageFormat::for_path(path, None).unwrap_or(ImageFormat::Png);
        let written = encode_image(format, p.width as u32, p.height as u32, p.rgb, &text).and_then(|bytes| output::write_atomically(path, &bytes));
        if let Err(e) = written {
            self.bar.warning(&format!("warning: --preview {}: {e}", path.display()));
        }
    }
}
