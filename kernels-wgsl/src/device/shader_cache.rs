//! The device's compiled kernels: each shader module built once, each
//! pipeline (an entry point with its override constants) once, through the
//! driver's cache where the backend keeps one between runs (`compiled`),
//! and what compiling cost this run.

use super::compiled::{Cache, CompileReport};
use super::{lock, PipelineStore};
use crate::kernel::{Kernel, Module};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// A pipeline: an entry point of a module with its override constants.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PipelineKey {
    pub module: Module,
    pub entry: &'static str,
    pub constants: Vec<(&'static str, u32)>,
}

/// The compiled kernels of one device.
#[derive(Debug)]
pub(super) struct ShaderCache {
    modules: Mutex<HashMap<Module, wgpu::ShaderModule>>,
    pipelines: Mutex<HashMap<PipelineKey, Arc<wgpu::ComputePipeline>>>,
    /// The driver's cache, where the backend offers one and a store was given.
    cache: Option<Cache>,
    cache_state: super::CacheState,
    /// Pipelines compiled and the time spent compiling them.
    compiled: Mutex<(usize, std::time::Duration)>,
    /// A folder whose `<Module:?>.wgsl` replace the built-in sources ([`crate::GpuOptions::kernel_dir`]).
    kernel_dir: Option<std::path::PathBuf>,
    /// The matrix modules' cooperative matrices emulated in subgroups of
    /// this many invocations ([`crate::emulated_matrix`]): only in the tests.
    #[cfg(any(test, feature = "test-support"))]
    pub(super) emulated_subgroup: Option<u32>,
    /// The tile slots each emulated module's subgroups use.
    #[cfg(any(test, feature = "test-support"))]
    emulated_slots: Mutex<HashMap<Module, u32>>,
}

impl ShaderCache {
    /// The cache of `device`, its driver's cache loaded from `store`.
    pub(super) fn new(device: &wgpu::Device, info: &wgpu::AdapterInfo, store: Option<&Arc<dyn PipelineStore>>, kernel_dir: Option<std::path::PathBuf>) -> Self {
        let (cache, cache_state) = Cache::open(device, info, store);
        Self {
            modules: Mutex::default(),
            pipelines: Mutex::default(),
            cache,
            cache_state,
            compiled: Mutex::default(),
            kernel_dir,
            #[cfg(any(test, feature = "test-support"))]
            emulated_subgroup: None,
            #[cfg(any(test, feature = "test-support"))]
            emulated_slots: Mutex::default(),
        }
    }

    /// Pipelines compiled so far, the time they took, and the driver cache's state.
    pub(super) fn report(&self) -> CompileReport {
        let (pipelines, time) = *lock(&self.compiled);
        CompileReport { pipelines, time, cache: self.cache_state }
    }

    /// The pipelines built so far, in order of module, entry point and constants.
    pub(super) fn created(&self) -> Vec<PipelineKey> {
        let mut keys: Vec<PipelineKey> = lock(&self.pipelines).keys().cloned().collect();
        keys.sort();
        keys
    }

    /// The source `module` is built from here.
    pub(super) fn source(&self, module: Module) -> std::borrow::Cow<'static, str> {
        let source = replaced_source(self.kernel_dir.as_deref(), module).map_or_else(|| module.source(), Into::into);
        #[cfg(any(test, feature = "test-support"))]
        if let Some(subgroup) = self.emulated_subgroup.filter(|_| module.is_matrix()) {
            let emulated = crate::emulated_matrix::emulate(&source, subgroup).unwrap_or_else(|why| panic!("{}: emulating its cooperative matrices: {why}", module.name()));
            lock(&self.emulated_slots).insert(module, emulated.slots);
            return emulated.source.into();
        }
        source
    }

    /// Where `module`'s cooperative matrices are emulated, the tile slots
    /// its subgroups use (its pipeline built first).
    #[cfg(any(test, feature = "test-support"))]
    pub(super) fn emulated_slots(&self, module: Module) -> Option<u32> {
        lock(&self.emulated_slots).get(&module).copied()
    }

    /// The compute pipeline for `kernel` with its override constants on `device`, built once.
    pub(super) fn pipeline(&self, device: &wgpu::Device, kernel: &Kernel, constants: &[(&'static str, u32)]) -> Arc<wgpu::ComputePipeline> {
        let key = PipelineKey { module: kernel.module, entry: kernel.entry, constants: constants.to_vec() };
        if let Some(p) = lock(&self.pipelines).get(&key) {
            return p.clone();
        }
        let started = std::time::Instant::now();
        let module = lock(&self.modules).entry(kernel.module).or_insert_with(|| self.module(device, kernel.module)).clone();
        let values: Vec<(&str, f64)> = constants.iter().map(|&(n, v)| (n, v as f64)).collect();
        let pipeline = Arc::new(device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(kernel.entry),
            layout: None,
            module: &module,
            entry_point: Some(kernel.entry),
            compilation_options: wgpu::PipelineCompilationOptions {
                constants: &values,
                zero_initialize_workgroup_memory: false,
            },
            cache: self.cache.as_ref().map(|c| &c.cache),
        }));
        let mut compiled = lock(&self.compiled);
        compiled.0 += 1;
        compiled.1 += started.elapsed();
        lock(&self.pipelines).insert(key, pipeline.clone());
        pipeline
    }

    /// `module` built from its source (or the kernel folder's replacement).
    fn module(&self, device: &wgpu::Device, module: Module) -> wgpu::ShaderModule {
        let source = self.source(module);
        let descriptor = wgpu::ShaderModuleDescriptor { label: Some(module.name()), source: wgpu::ShaderSource::Wgsl(source) };
        if module.indices_clamped_in_shader() {
            // SAFETY: the module reads and writes only at indices it clamps
            // or selects into its bindings itself
            // (Module::indices_clamped_in_shader), so wgpu's own bounds
            // checks, which branch around every access and keep the loads
            // from being issued together, add nothing.
            unsafe { device.create_shader_module_trusted(descriptor, wgpu::ShaderRuntimeChecks::unchecked()) }
        } else {
            device.create_shader_module(descriptor)
        }
    }
}

impl Drop for ShaderCache {
    /// The compiled pipelines go back to the store for the next run.
    fn drop(&mut self) {
        if let Some(cache) = &self.cache {
            cache.save();
        }
    }
}

/// The source `FLUX_LITE_KERNEL_DIR` puts in place of `module`'s, if `dir`
/// holds `<Module:?>.wgsl` ([`crate::GpuOptions::kernel_dir`]); said on standard
/// error, since the results are then that file's.
pub(super) fn replaced_source(dir: Option<&std::path::Path>, module: Module) -> Option<String> {
    let path = dir?.join(module.file_name());
    let source = std::fs::read_to_string(&path).ok()?;
    eprintln!("kernel {}: built from {}", module.name(), path.display());
    Some(source)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kernel_folder_replaces_only_the_modules_it_holds() {
        let dir = std::env::temp_dir().join(format!("flux-lite-kernel-dir-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("AttentionFlash16.wgsl"), "// a variant").unwrap();
        assert_eq!(replaced_source(Some(&dir), Module::AttentionFlash16).as_deref(), Some("// a variant"));
        assert_eq!(replaced_source(Some(&dir), Module::AttentionFlash8), None);
        assert_eq!(replaced_source(None, Module::AttentionFlash16), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
