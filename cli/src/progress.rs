//! The progress bar on stderr: one line, redrawn in place.

use flux_lite_platform::pipeline::{Observer, Progress};
use std::io::Write;

const WIDTH: usize = 30;

#[derive(Debug)]
pub struct Bar {
    quiet: bool,
    drawn: bool,
}

impl Bar {
    pub fn new(quiet: bool) -> Self {
        Self { quiet, drawn: false }
    }

    pub fn show(&mut self, p: Progress) {
        let (label, done, total, detail) = match p {
            Progress::Encode { prompt, prompts, block } => {
                let label = if prompts > 1 { format!("encode {}/{prompts}", prompt + 1) } else { "encode".into() };
                (label, block.done, block.total, format!("layer {}/{}", block.done, block.total))
            }
            Progress::References { done, total } => ("references".into(), done, total, format!("{done}/{total}")),
            Progress::Denoise(s) => {
                let done = s.step * s.block.total + s.block.done;
                let detail = format!("step {}/{} block {}/{}", s.step + 1, s.steps, s.block.done, s.block.total);
                ("denoise".into(), done, s.steps * s.block.total, detail)
            }
            Progress::Decode { done, total } => ("decode".into(), done, total, format!("{done}/{total}")),
        };
        self.draw(&label, done, total, &detail);
    }

    /// One line: `label [####......] detail`, `done` of `total` filled.
    pub fn draw(&mut self, label: &str, done: usize, total: usize, detail: &str) {
        if self.quiet {
            return;
        }
        let filled = (done * WIDTH).checked_div(total).unwrap_or(WIDTH);
        let bar: String = (0..WIDTH).map(|i| if i < filled { '#' } else { '.' }).collect();
        eprint!("\r{label:<10} [{bar}] {detail:<28}");
        let _ = std::io::stderr().flush();
        self.drawn = true;
    }

    /// Ends the bar's line so later messages start on a fresh one.
    pub fn finish(&mut self) {
        if self.drawn {
            eprintln!();
            self.drawn = false;
        }
    }
}

/// The bar follows a run's progress; a warning ends the bar's line first.
impl Observer for Bar {
    fn progress(&mut self, p: Progress) {
        self.show(p);
    }

    fn warning(&mut self, message: &str) {
        self.finish();
        eprintln!("{message}");
    }
}
