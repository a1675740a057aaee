//! `GET /metrics`: what an operator graphs, in Prometheus' text format:
//! jobs by outcome, the queue, seconds per step and per image, device
//! memory planned and used, and which adapter, tier and model serve.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

/// Counters the worker and the handlers add to as jobs come and go.
#[derive(Debug, Default)]
pub struct Metrics {
    done: AtomicU64,
    failed: AtomicU64,
    cancelled: AtomicU64,
    /// Turned away at the door: the queue full, or the server stopping.
    refused: AtomicU64,
    images: AtomicU64,
    image_micros: AtomicU64,
    steps: AtomicU64,
    step_micros: AtomicU64,
    /// The device bytes the last job's plan reserved at its peak.
    planned_bytes: AtomicU64,
}

/// How a job ended, as `flux_lite_jobs_total` labels it.
#[derive(Debug, Clone, Copy)]
pub enum Outcome {
    Done,
    Failed,
    Cancelled,
    Refused,
}

impl Metrics {
    pub fn count(&self, outcome: Outcome) {
        let counter = match outcome {
            Outcome::Done => &self.done,
            Outcome::Failed => &self.failed,
            Outcome::Cancelled => &self.cancelled,
            Outcome::Refused => &self.refused,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// A finished job's images, steps and their times, and its plan's device peak.
    pub fn record(&self, images: usize, seconds: f64, step_seconds: &[f64], planned_bytes: u64) {
        self.images.fetch_add(images as u64, Ordering::Relaxed);
        self.image_micros.fetch_add((seconds * 1e6) as u64, Ordering::Relaxed);
        self.steps.fetch_add(step_seconds.len() as u64, Ordering::Relaxed);
        self.step_micros.fetch_add((step_seconds.iter().sum::<f64>() * 1e6) as u64, Ordering::Relaxed);
        self.planned_bytes.store(planned_bytes, Ordering::Relaxed);
    }

    /// The exposition: every metric with its HELP and TYPE lines.
    /// `queued` and `running`: the jobs waiting and running now.
    pub fn render(&self, (queued, running): (usize, usize), device: &Device) -> String {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let mut out = String::new();
        let plain = |v: u64| vec![(String::new(), v.to_string())];
        let outcomes = [("done", get(&self.done)), ("failed", get(&self.failed)), ("cancelled", get(&self.cancelled)), ("refused", get(&self.refused))];
        let by_outcome: Vec<(String, String)> = outcomes.iter().map(|(o, n)| (format!("{{outcome=\"{o}\"}}"), n.to_string())).collect();
        family(&mut out, "flux_lite_jobs_total", "counter", "Jobs ended, by outcome (refused: the queue was full or the server stopping).", &by_outcome);
        family(&mut out, "flux_lite_queue_depth", "gauge", "Jobs waiting behind the running one.", &plain(queued as u64));
        family(&mut out, "flux_lite_jobs_running", "gauge", "Jobs running (0 or 1).", &plain(running as u64));
        let summary = |micros: u64, count: u64| vec![("_sum".to_string(), format!("{:.6}", micros as f64 / 1e6)), ("_count".to_string(), count.to_string())];
        family(&mut out, "flux_lite_step_seconds", "summary", "Seconds per denoising step.", &summary(get(&self.step_micros), get(&self.steps)));
        let per_image = "Seconds per image, from the job's start to its images (load, encode, steps, decode).";
        family(&mut out, "flux_lite_image_seconds", "summary", per_image, &summary(get(&self.image_micros), get(&self.images)));
        family(&mut out, "flux_lite_device_memory_planned_bytes", "gauge", "Device bytes the last job's memory plan reserved at its peak.", &plain(get(&self.planned_bytes)));
        family(&mut out, "flux_lite_device_memory_used_bytes", "gauge", "Device bytes in buffers now.", &plain(device.live));
        family(&mut out, "flux_lite_device_memory_high_water_bytes", "gauge", "The most device bytes in buffers at once since the server started.", &plain(device.high_water));
        if let Some(budget) = device.budget {
            family(&mut out, "flux_lite_device_memory_budget_bytes", "gauge", "The memory one request may use (--memory-budget, or the adapter's default).", &plain(budget));
        }
        let info = format!("{{adapter=\"{}\",tier=\"{}\",model=\"{}\"}}", escaped(&device.adapter), escaped(&device.tier), escaped(&device.model));
        family(&mut out, "flux_lite_info", "gauge", "The adapter, precision tier and model serving (always 1).", &[(info, "1".into())]);
        out
    }
}

/// One metric family: its HELP and TYPE lines, then each sample as
/// `name` + its suffix or labels + its value.
fn family(out: &mut String, name: &str, kind: &str, help: &str, samples: &[(String, String)]) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
    for (suffix, value) in samples {
        let _ = writeln!(out, "{name}{suffix} {value}");
    }
}

/// What the device says when the metrics are read.
#[derive(Debug, Clone)]
pub struct Device {
    pub live: u64,
    pub high_water: u64,
    pub budget: Option<u64>,
    pub adapter: String,
    pub tier: String,
    pub model: String,
}

/// A label value as the text format writes it: `\`, `"` and line breaks escaped.
fn escaped(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exposition_has_each_family_and_escapes_labels() {
        let m = Metrics::default();
        m.count(Outcome::Done);
        m.count(Outcome::Refused);
        m.record(2, 3.0, &[0.5, 0.25, 0.25], 1 << 20);
        let device = Device { live: 5, high_water: 7, budget: Some(9), adapter: "GPU \"x\"\\1".into(), tier: "f32".into(), model: "tiny-a".into() };
        let text = m.render((0, 0), &device);
        for line in [
            "flux_lite_jobs_total{outcome=\"done\"} 1",
            "flux_lite_jobs_total{outcome=\"refused\"} 1",
            "flux_lite_jobs_total{outcome=\"failed\"} 0",
            "flux_lite_queue_depth 0",
            "flux_lite_step_seconds_sum 1.000000",
            "flux_lite_step_seconds_count 3",
            "flux_lite_image_seconds_count 2",
            "flux_lite_device_memory_planned_bytes 1048576",
            "flux_lite_device_memory_high_water_bytes 7",
            "flux_lite_device_memory_budget_bytes 9",
            "flux_lite_info{adapter=\"GPU \\\"x\\\"\\\\1\",tier=\"f32\",model=\"tiny-a\"} 1",
            "# TYPE flux_lite_step_seconds summary",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
        }
    }
}
