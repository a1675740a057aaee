//! The server's recent images, kept in memory for its page's gallery: each
//! with the settings it carries, so the page can show them, offer the file
//! and run them again. Bounded by count (`--gallery`); the oldest go first.

use flux_lite_platform::pipeline::image_file::ImageFormat;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// One image the server made.
#[derive(Debug, Clone)]
pub struct Shot {
    pub id: String,
    pub job: String,
    pub seed: u64,
    /// Seconds since the epoch.
    pub created: u64,
    pub format: ImageFormat,
    pub bytes: Arc<Vec<u8>>,
    /// Its recipe (the `flux-lite` chunk) as JSON.
    pub settings: serde_json::Value,
}

#[derive(Debug)]
pub struct Gallery {
    shots: Mutex<VecDeque<Shot>>,
    capacity: usize,
    next: AtomicU64,
}

impl Gallery {
    pub fn new(capacity: usize) -> Self {
        Self { shots: Mutex::new(VecDeque::new()), capacity, next: AtomicU64::new(1) }
    }

    /// Keeps a new image, forgetting the oldest beyond the capacity.
    pub fn add(&self, job: &str, seed: u64, format: ImageFormat, bytes: Vec<u8>, settings: serde_json::Value) {
        if self.capacity == 0 {
            return;
        }
        let id = format!("img-{}", self.next.fetch_add(1, Ordering::Relaxed));
        let created = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let mut shots = self.shots.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        shots.push_back(Shot { id, job: job.to_string(), seed, created, format, bytes: Arc::new(bytes), settings });
        while shots.len() > self.capacity {
            shots.pop_front();
        }
    }

    /// The kept images, newest first.
    pub fn list(&self) -> Vec<Shot> {
        self.shots.lock().unwrap_or_else(std::sync::PoisonError::into_inner).iter().rev().cloned().collect()
    }

    pub fn find(&self, id: &str) -> Option<Shot> {
        self.shots.lock().unwrap_or_else(std::sync::PoisonError::into_inner).iter().find(|s| s.id == id).cloned()
    }
}

impl Shot {
    /// The listing's entry: where the file is, and what made it.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "id": self.id,
            "job": self.job,
            "seed": self.seed,
            "created": self.created,
            "format": self.format.name(),
            "url": format!("/v1/gallery/{}", self.id),
            "settings": self.settings,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_are_kept_and_listed_first() {
        let g = Gallery::new(2);
        for seed in 0..3 {
            g.add("job-1", seed, ImageFormat::Png, vec![seed as u8], serde_json::json!({ "seed": seed }));
        }
        let seeds: Vec<u64> = g.list().iter().map(|s| s.seed).collect();
        assert_eq!(seeds, [2, 1]);
        assert!(g.find("img-1").is_none() && g.find("img-3").is_some_and(|s| *s.bytes == [2]));
        let none = Gallery::new(0);
        none.add("job-1", 0, ImageFormat::Png, vec![0], serde_json::Value::Null);
        assert!(none.list().is_empty());
    }
}
