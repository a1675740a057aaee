//! Compiled pipelines kept between runs: where the backend offers a
//! pipeline cache (Vulkan), the driver's compiled kernels are loaded at
//! start from the caller's [`PipelineStore`] and handed back to it when the
//! device is dropped, so a second run skips the shader compiles. Also what
//! compiling cost this run, for `gen --verbose`.

use std::sync::Arc;
use std::time::Duration;

/// Where a device's compiled pipelines persist (the engine keeps them in a
/// file in the user's cache folder). Keys name the adapter and driver
/// (`wgpu::util::pipeline_cache_key`); the data is the driver's own, and a
/// stale or foreign blob is ignored by the driver, never trusted.
pub trait PipelineStore: Send + Sync + std::fmt::Debug {
    fn load(&self, key: &str) -> Option<Vec<u8>>;
    /// A failed save is not an error: the next run compiles again.
    fn save(&self, key: &str, data: &[u8]);
}

/// The pipeline cache's state for this device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheState {
    /// The backend has none (Metal, GL, DX12 through wgpu today).
    Unsupported,
    /// No store was given.
    Off,
    /// Nothing stored yet for this adapter and driver.
    Empty,
    /// This many bytes were loaded.
    Loaded(usize),
}

impl std::fmt::Display for CacheState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CacheState::Unsupported => f.write_str("pipeline cache: not offered by this backend"),
            CacheState::Off => f.write_str("pipeline cache: off"),
            CacheState::Empty => f.write_str("pipeline cache: empty (this run fills it)"),
            CacheState::Loaded(bytes) => write!(f, "pipeline cache: {bytes} bytes loaded"),
        }
    }
}

/// What compiling kernels cost this device so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompileReport {
    pub pipelines: usize,
    /// Wall time in shader module and pipeline creation.
    pub time: Duration,
    pub cache: CacheState,
}

/// The device's cache and the store it came from.
#[derive(Debug)]
pub(super) struct Cache {
    pub(super) cache: wgpu::PipelineCache,
    key: String,
    store: Arc<dyn PipelineStore>,
    pub(super) state: CacheState,
}

impl Cache {
    /// The cache for `device`, loaded from `store`, where the adapter offers one.
    pub(super) fn open(device: &wgpu::Device, info: &wgpu::AdapterInfo, store: Option<&Arc<dyn PipelineStore>>) -> (Option<Self>, CacheState) {
        let (Some(store), true) = (store, device.features().contains(wgpu::Features::PIPELINE_CACHE)) else {
            let state = if device.features().contains(wgpu::Features::PIPELINE_CACHE) { CacheState::Off } else { CacheState::Unsupported };
            return (None, state);
        };
        let Some(key) = wgpu::util::pipeline_cache_key(info) else { return (None, CacheState::Unsupported) };
        let data = store.load(&key);
        let state = data.as_ref().map_or(CacheState::Empty, |d| CacheState::Loaded(d.len()));
        // SAFETY: `data` is what this store saved for this adapter and driver
        // (the key names both) and `fallback` makes the driver discard a blob
        // it does not recognise; wgpu validates the header it wrote itself.
        let cache = unsafe { device.create_pipeline_cache(&wgpu::PipelineCacheDescriptor { label: Some("flux-lite pipelines"), data: data.as_deref(), fallback: true }) };
        (Some(Self { cache, key, store: store.clone(), state }), state)
    }

    /// Hands the cache's data to the store, when it holds more than was loaded.
    pub(super) fn save(&self) {
        let loaded = match self.state {
            CacheState::Loaded(bytes) => bytes,
            _ => 0,
        };
        if let Some(data) = self.cache.get_data().filter(|d| d.len() > loaded) {
            self.store.save(&self.key, &data);
        }
    }
}
