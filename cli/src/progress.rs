//! Progress on stderr, hidden by `--quiet`. On a terminal, a bar redrawn in
//! place (indicatif); otherwise (a log file, a pipe) one line when a stage
//! starts and one per finished unit (a layer stack, a step, a decode), so a
//! log shows where a run got to without carriage-return noise.

use flux_lite_platform::pipeline::{Observer, Progress};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;

#[derive(Debug)]
pub struct Bar {
    quiet: bool,
    terminal: bool,
    bar: Option<ProgressBar>,
    /// The stage the log lines are about (when not on a terminal).
    stage: String,
    /// `(index, count)` of the batch's image being denoised or decoded, when a batch has several.
    image: Option<(usize, usize)>,
}

impl Bar {
    pub fn new(quiet: bool) -> Self {
        Self { quiet, terminal: std::io::stderr().is_terminal(), bar: None, stage: String::new(), image: None }
    }

    /// Image `index` of `count` starts a phase: the denoise and decode labels name it.
    pub fn image(&mut self, index: usize, count: usize) {
        self.image = (count > 1).then_some((index, count));
    }

    /// Shows where a generation is: a label for the stage, its fraction, and a detail.
    pub fn show(&mut self, p: Progress) {
        // A unit is done at the end of a whole stage, or of a denoising step.
        let unit_done = match p {
            Progress::Denoise(s) => s.block.done == s.block.total,
            _ => false,
        };
        let (label, done, total, detail) = match p {
            Progress::Encode { prompt, prompts, block } => {
                let label = if prompts > 1 { format!("encode {}/{prompts}", prompt + 1) } else { "encode".into() };
                (label, block.done, block.total, format!("layer {}/{}", block.done, block.total))
            }
            Progress::References { done, total } => ("references".into(), done, total, format!("{done}/{total}")),
            Progress::Denoise(s) => {
                let done = s.step * s.block.total + s.block.done;
                let detail = format!("step {}/{} block {}/{}", s.step + 1, s.steps, s.block.done, s.block.total);
                (self.of_image("denoise"), done, s.steps * s.block.total, detail)
            }
            Progress::Decode { done, total } => (self.of_image("decode"), done, total, format!("{done}/{total}")),
        };
        self.update(&label, done, total, &detail, unit_done);
    }

    /// `denoise 2/8` while image 2 of 8 is being denoised.
    fn of_image(&self, stage: &str) -> String {
        match self.image {
            Some((index, count)) => format!("{stage} {}/{count}", index + 1),
            None => stage.into(),
        }
    }

    /// Draws `label [####....] detail` at `done` of `total`; a new label starts a new line.
    pub fn draw(&mut self, label: &str, done: usize, total: usize, detail: &str) {
        self.update(label, done, total, detail, false);
    }

    fn update(&mut self, label: &str, done: usize, total: usize, detail: &str, unit_done: bool) {
        if self.quiet {
            return;
        }
        if !self.terminal {
            if self.stage != label {
                self.stage = label.to_string();
                eprintln!("{label} …");
            }
            if unit_done || done == total {
                eprintln!("{label}: {detail}");
            }
            return;
        }
        if self.bar.as_ref().is_some_and(|b| b.prefix() != label) {
            self.finish();
        }
        let bar = self.bar.get_or_insert_with(|| new_bar(label));
        bar.set_length(total as u64);
        bar.set_position(done as u64);
        bar.set_message(detail.to_string());
    }

    /// Ends the current line (the bar stays on screen).
    pub fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.abandon();
        }
    }
}

fn new_bar(label: &str) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    // The template is a constant; were it ever invalid, the default style is a fine bar.
    let style = ProgressStyle::with_template("{prefix:<10} [{bar:30}] {msg:<28} {elapsed}").map_or_else(|_| ProgressStyle::default_bar(), |s| s.progress_chars("#>."));
    bar.set_style(style);
    bar.set_prefix(label.to_string());
    bar
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

    fn image(&mut self, index: usize, count: usize) {
        Bar::image(self, index, count);
    }
}
