//! The device context: backend and adapter choice, the device with its
//! limits. Its concerns each have a file: the compiled kernels in
//! `shader_cache` (and the driver's cache between runs in `compiled`), the
//! buffers, uploads, submissions and readbacks in `buffers`, the counted
//! memory in `memory`, the precision tier chosen for it in `tiers` (proven
//! in `proof`).

mod adapter_memory;
mod buffers;
mod compiled;
mod memory;
mod shader_cache;
mod options;
#[cfg(not(any(target_arch = "wasm32", target_vendor = "apple")))]
mod pipeline_statistics;
mod proof;
mod tiers;

pub use adapter_memory::{AdapterMemory, MemorySource, DEFAULT_MARGIN_PERCENT};
pub use compiled::{CacheState, CompileReport, PipelineStore};
pub use memory::{DeviceBuffer, DeviceMemory};
pub use options::{AttentionChoice, Backend, GpuOptions};
#[cfg(not(any(target_arch = "wasm32", target_vendor = "apple")))]
pub use pipeline_statistics::{pipeline_name, Executable, PipelineStatistics, StatisticsError};
pub use shader_cache::PipelineKey;
#[cfg(any(test, feature = "test-support"))]
pub use options::FaultInjection;
use memory::{CountedBuffer, MemoryCounter};
use shader_cache::ShaderCache;
use tiers::choose_tier;

use crate::error::{one_line, GpuError};
use crate::kernel::Kernel;
use crate::precision::{describe, MatrixConfig, Precision};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use flux_lite_core::plan::UPLOAD_STAGING;
use wgpu::util::DeviceExt;

/// The most bytes one upload stages at a time (a larger tensor goes in chunks).
pub const UPLOAD_CHUNK: u64 = 4 << 20;

/// The first error the device reported outside a call's own result (device
/// lost, out of memory, a validation error): wgpu would panic on these; we
/// keep the first and fail the next submission or wait with it.
#[derive(Debug, Default)]
struct Faults(Mutex<Option<GpuError>>);

impl Faults {
    /// Keeps the first fault, except that a lost device replaces any other:
    /// it is why the others (invalid buffers, failed maps) happened.
    fn record(&self, fault: GpuError) {
        let mut first = lock(&self.0);
        let lost = |f: &GpuError| matches!(f, GpuError::DeviceLost(_));
        if first.as_ref().is_none_or(|f| lost(&fault) && !lost(f)) {
            *first = Some(fault);
        }
    }

    fn check(&self) -> Result<(), GpuError> {
        lock(&self.0).as_ref().map_or(Ok(()), |f| Err(f.clone()))
    }

    /// Records wgpu's reports on `device` here instead of panicking.
    fn watch(self: &Arc<Self>, device: &wgpu::Device) {
        let faults = self.clone();
        device.set_device_lost_callback(move |reason, message| {
            let why = if message.is_empty() { format!("{reason:?}") } else { format!("{reason:?}: {message}") };
            faults.record(GpuError::DeviceLost(why));
        });
        let faults = self.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            faults.record(match e {
                wgpu::Error::OutOfMemory { source } => GpuError::OutOfMemory(one_line(&source.to_string())),
                wgpu::Error::Validation { description, .. } => GpuError::Device(one_line(&description)),
                wgpu::Error::Internal { description, .. } => GpuError::Device(one_line(&description)),
            })
        }));
    }
}


/// The flash attention's two paths, each taken where its own start-up
/// check passed ([`crate::probe_flash`]): over f32 rows (queries, keys and
/// values as f32, into either output) and over f16 pieces (the
/// transformer's blocks on the matrix tier's f16 tiles).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FlashPaths {
    pub rows: bool,
    pub pieces: bool,
}

impl FlashPaths {
    /// Whether the path of these inputs (f16 pieces, or f32 rows) runs the flash kernel.
    pub fn takes(self, half_inputs: bool) -> bool {
        if half_inputs { self.pieces } else { self.rows }
    }
}

/// A device ready to run flux-lite's kernels.
#[derive(Debug)]
pub struct Gpu {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub info: wgpu::AdapterInfo,
    pub limits: wgpu::Limits,
    /// A small buffer bound where a kernel's optional input is absent.
    placeholder: wgpu::Buffer,
    /// Another, bound where a writable binding goes unused.
    unused_writable: wgpu::Buffer,
    /// Whether launchers take their CPU-shaped kernels (a CPU adapter, not overridden).
    cpu_shaped: bool,
    /// The subgroup size CPU-shaped kernels share loads across, where they
    /// may ([`Gpu::cpu_lanes`]).
    cpu_lanes: Option<u32>,
    /// The compiled kernels, and the driver's cache of them between runs.
    shaders: ShaderCache,
    memory: Arc<MemoryCounter>,
    faults: Arc<Faults>,
    interrupt: Arc<AtomicBool>,
    submissions: AtomicU64,
    /// Upload bytes staged on the host since the last flush.
    staged_uploads: AtomicU64,
    /// Bytes written into device buffers from the host, ever.
    written: AtomicU64,
    attention: AttentionChoice,
    /// The faults the tests inject (`test-support` builds only).
    #[cfg(any(test, feature = "test-support"))]
    injected: FaultInjection,
    precision: Precision,
    /// The configuration the matrix tier runs, when it is the tier.
    matrix: Option<MatrixConfig>,
    /// What the adapter lists, whatever the tier: for `flux-lite gpu`.
    matrix_offered: Vec<wgpu::CooperativeMatrixProperties>,
    /// Which of the matrix tier's flash attention's paths passed their start-up checks ([`crate::probe_flash`]).
    flash: FlashPaths,
    /// Why `auto` stepped down a tier, or the flash attention was left out, when it was.
    notice: Option<String>,
    /// Why `auto` took its tier over a faster-looking one the adapter
    /// offers (on a CPU adapter, f32), when it did.
    auto_reason: Option<String>,
    /// What the adapter offers, for a default budget, where it can be known.
    memory_offered: Option<AdapterMemory>,
    /// The range rule's row scales of the matrix tier's products, written by
    /// each product's pre-pass and read by its tiles (one product at a time).
    range_scales: Mutex<Option<DeviceBuffer>>,
}

/// [`Gpu::cpu_lanes`] for an adapter: its subgroup size where `wanted`
/// (CPU-shaped kernels that may use subgroups), the adapter offers
/// subgroups, and their size is fixed and one the kernels are written for.
fn cpu_lanes(wanted: bool, offered: wgpu::Features, info: &wgpu::AdapterInfo) -> Option<u32> {
    let fixed = info.subgroup_min_size == info.subgroup_max_size;
    let written = crate::kernels::lanes::LANE_COUNTS.contains(&info.subgroup_min_size);
    (wanted && offered.contains(wgpu::Features::SUBGROUP) && fixed && written).then_some(info.subgroup_min_size)
}

/// The largest storage binding the engine will make on `backend`, given the
/// one the adapter reports. Metal reports its largest buffer (which can pass
/// 4 GiB on a Mac with much memory), but the shaders' bounds checks there
/// count bytes in 32 bits: a larger binding would read wrong data, so the
/// binding is held to 2³¹ − 1 bytes, the figure Vulkan drivers report.
pub fn binding_limit(backend: wgpu::Backend, reported: u64) -> u64 {
    match backend {
        wgpu::Backend::Metal => reported.min(METAL_BINDING_LIMIT),
        _ => reported,
    }
}

/// [`binding_limit`]'s bound on Metal.
pub const METAL_BINDING_LIMIT: u64 = (1 << 31) - 1;

/// Picks one adapter of several (one server per GPU): its index among the
/// backend's adapters (a wrong one lists them), or a part of its name.
pub const ADAPTER_VARIABLE: &str = "FLUX_LITE_ADAPTER";

/// The adapter `wanted` names: an index into the backend's adapters, or a
/// case-insensitive part of one's name.
fn pick_adapter(instance: &wgpu::Instance, backend: Backend, wanted: &str) -> Result<wgpu::Adapter, GpuError> {
    let adapters = pollster::block_on(instance.enumerate_adapters(backend.wgpu()));
    let names: Vec<String> = adapters.iter().map(|a| a.get_info().name).collect();
    let index = match wanted.parse::<usize>() {
        Ok(i) => Some(i).filter(|&i| i < adapters.len()),
        Err(_) => names.iter().position(|n| n.to_lowercase().contains(&wanted.to_lowercase())),
    };
    let listed = names.iter().enumerate().map(|(i, n)| format!("{i}: {n}")).collect::<Vec<_>>().join(", ");
    let detail = format!("{ADAPTER_VARIABLE}={wanted} names none of the adapters ({listed})");
    index.and_then(|i| adapters.into_iter().nth(i)).ok_or(GpuError::NoAdapter { backend: backend.name(), detail })
}

impl Gpu {
    /// The device for `options`, its tier chosen but not yet proven.
    fn unproven(options: &GpuOptions) -> Result<Self, GpuError> {
        let backend = options.backend.unwrap_or_else(Backend::platform_default);
        // wgpu's own WGPU_* variables are not read either: the library takes its settings as options.
        let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
        desc.backends = backend.wgpu();
        // The shipped build's flags in every build. A debug build's default
        // adds DEBUG, under which naga writes a source line into each
        // statement of every SPIR-V module, counting the source's newlines
        // from its start each time: 0.8 s of a tiny model's 2.9 s run, and
        // kernels other than the ones users run.
        desc.flags = wgpu::InstanceFlags::VALIDATION_INDIRECT_CALL;
        let instance = wgpu::Instance::new(desc);
        let adapter = match &options.adapter {
            Some(wanted) => pick_adapter(&instance, backend, wanted)?,
            None => pollster::block_on(instance.request_adapter(&wgpu::RequestAdapterOptions {
                power_preference: wgpu::PowerPreference::HighPerformance,
                ..Default::default()
            }))
            .map_err(|e| GpuError::NoAdapter { backend: backend.name(), detail: e.to_string() })?,
        };
        let info = adapter.get_info();
        let mut limits = adapter.limits();
        limits.max_storage_buffer_binding_size = binding_limit(info.backend, limits.max_storage_buffer_binding_size);
        if let Some(cap) = options.max_storage_binding {
            limits.max_storage_buffer_binding_size = limits.max_storage_buffer_binding_size.min(cap);
        }
        if let Some(cap) = options.max_workgroup_memory {
            limits.max_compute_workgroup_storage_size = limits.max_compute_workgroup_storage_size.min(cap);
        }
        let memory_offered = adapter_memory::query(&adapter, &info);
        let matrix_offered = adapter.cooperative_matrix_properties();
        // Timestamps where the adapter has them: `bench` times passes on the GPU's own clock.
        let mut features = adapter.features() & (wgpu::Features::TIMESTAMP_QUERY | wgpu::Features::PIPELINE_CACHE);
        let choice = choose_tier(&adapter, &limits, &info, &matrix_offered, options)?;
        // The tests' emulated cooperative matrices, where the tier is the
        // matrix one: its kernels are planned for the emulated adapter's
        // workgroup memory, as the tier's configuration was; the device
        // keeps the adapter's own (below).
        #[cfg(any(test, feature = "test-support"))]
        let emulated = options.emulated_matrix.filter(|_| choice.tier == crate::Precision::Matrix);
        #[cfg(any(test, feature = "test-support"))]
        if let Some(emulated) = emulated {
            limits.max_compute_workgroup_storage_size = emulated.planned_memory(adapter.limits().max_compute_workgroup_storage_size, options.max_workgroup_memory);
        }
        features |= choice.features;
        let cpu_shaped = info.device_type == wgpu::DeviceType::Cpu && !options.gpu_shaped_kernels;
        let cpu_lanes = cpu_lanes(cpu_shaped && !options.per_lane_reads, adapter.features(), &info);
        if cpu_lanes.is_some() {
            features |= wgpu::Features::SUBGROUP;
        }
        let mut experimental = wgpu::ExperimentalFeatures::disabled();
        if choice.features.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX) {
            // SAFETY: the token only allows asking for the experimental cooperative-matrix
            // feature; it is asked for only on the matrix tier, whose kernels are checked
            // against the f64 oracle (the matrix tests) and, under `auto`, by a
            // known-answer probe on this device before the tier is taken.
            experimental = unsafe { wgpu::ExperimentalFeatures::enabled() };
        }
        #[allow(unused_mut)] // changed only where the tests emulate cooperative matrices
        let mut device_limits = limits.clone();
        // The emulated tiles' buffer is bound whole: the device takes the
        // adapter's binding size, the kernels still split by the cap; and
        // it asks for no more workgroup memory than the adapter lists.
        #[cfg(any(test, feature = "test-support"))]
        if emulated.is_some() {
            device_limits.max_storage_buffer_binding_size = binding_limit(info.backend, adapter.limits().max_storage_buffer_binding_size);
            let adapters = adapter.limits().max_compute_workgroup_storage_size;
            device_limits.max_compute_workgroup_storage_size = device_limits.max_compute_workgroup_storage_size.min(adapters);
        }
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("flux-lite"),
            required_features: features,
            required_limits: device_limits,
            experimental_features: experimental,
            memory_hints: wgpu::MemoryHints::Performance,
            trace: wgpu::Trace::Off,
        }))
        .map_err(|e| GpuError::RequestDevice(e.to_string()))?;
        let faults = Arc::new(Faults::default());
        faults.watch(&device);
        #[allow(unused_mut)] // changed only where the tests emulate cooperative matrices
        let mut shaders = ShaderCache::new(&device, &info, options.pipeline_store.as_ref(), options.kernel_dir.clone());
        #[cfg(any(test, feature = "test-support"))]
        {
            shaders.emulated_subgroup = emulated.map(|e| e.subgroup);
        }
        let placeholder = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("placeholder"),
            size: 256,
            usage: storage_usage(),
            mapped_at_creation: false,
        });
        let unused_writable = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("unused writable binding"),
            size: 256,
            usage: storage_usage(),
            mapped_at_creation: false,
        });
        let memory = Arc::new(MemoryCounter::default());
        let made = placeholder.size() + unused_writable.size();
        memory.live.store(made, Ordering::Relaxed);
        memory.high_water.store(made, Ordering::Relaxed);
        let gpu = Self {
            memory,
            placeholder,
            unused_writable,
            cpu_shaped,
            cpu_lanes,
            device,
            queue,
            info,
            limits,
            shaders,
            faults,
            interrupt: options.interrupt.clone().unwrap_or_default(),
            submissions: AtomicU64::new(0),
            staged_uploads: AtomicU64::new(0),
            written: AtomicU64::new(0),
            attention: options.attention,
            #[cfg(any(test, feature = "test-support"))]
            injected: options.faults,
            precision: choice.tier,
            matrix: choice.matrix,
            matrix_offered,
            flash: FlashPaths::default(),
            notice: None,
            auto_reason: choice.reason,
            memory_offered,
            range_scales: Mutex::default(),
        };
        Ok(gpu)
    }

    /// The memory the adapter offers and where the figure came from, where
    /// it can be known ([`AdapterMemory::default_budget`] is a run's budget
    /// when none is given).
    pub fn memory_offered(&self) -> Option<AdapterMemory> {
        self.memory_offered
    }

    /// Pipelines compiled so far, the time they took, and the cache's state.
    pub fn compile_report(&self) -> CompileReport {
        self.shaders.report()
    }

    /// Where the matrix tier's cooperative matrices are emulated (the
    /// tests' [`GpuOptions::emulated_matrix`]), the buffer of tiles a
    /// dispatch of `module` over `grid` binds at
    /// [`crate::emulated_matrix::EMULATED_BINDING`] (its pipeline built first).
    #[cfg(any(test, feature = "test-support"))]
    pub(crate) fn emulated_tiles(&self, module: crate::Module, grid: [u32; 3]) -> Option<wgpu::Buffer> {
        let slots = self.shaders.emulated_slots(module)?;
        let workgroups = grid.iter().map(|&g| g as u64).product();
        let size = crate::emulated_matrix::tile_bytes(workgroups, slots, self.matrix?.size);
        Some(self.device.create_buffer(&wgpu::BufferDescriptor { label: Some("emulated tiles"), size, usage: wgpu::BufferUsages::STORAGE, mapped_at_creation: false }))
    }

    /// Where the matrix tier's attention runs `attention_flash.wgsl`: each
    /// path whose check passed when the device was made.
    pub fn flash_attention(&self) -> FlashPaths {
        self.flash
    }

    /// Which attention kernel the options force, if any.
    pub fn attention_choice(&self) -> AttentionChoice {
        self.attention
    }

    /// Whether the device runs the matrix tier on f16 operands: the
    /// half-precision data path (f16 activations and weights in memory,
    /// the channels-last VAE, the chunked attention, the flash kernel).
    pub fn f16_operands(&self) -> bool {
        self.matrix().is_some_and(|c| c.operands == crate::MatrixOperands::F16)
    }

    /// Whether the transformer's attention into f16 pieces, over f16 pieces
    /// (`half_inputs`) or f32 rows, runs as products on the GEMM core
    /// (`kernels::attention_on_products`): the matrix tier with f16 operands
    /// where the flash kernel's check of that path failed, or where the
    /// options ask for it.
    pub fn attention_on_products(&self, half_inputs: bool) -> bool {
        self.f16_operands()
            && match self.attention {
                AttentionChoice::Products => true,
                AttentionChoice::Launcher => !self.flash.takes(half_inputs),
                AttentionChoice::Tiled | AttentionChoice::Lanes | AttentionChoice::Matrix => false,
            }
    }

    /// The faults the options inject (`test-support` builds only).
    #[cfg(any(test, feature = "test-support"))]
    pub fn faults(&self) -> FaultInjection {
        self.injected
    }

    /// The precision tier this device runs.
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// Why `auto` stepped down from the tier the adapter offers, when it did.
    pub fn notice(&self) -> Option<&str> {
        self.notice.as_deref()
    }

    /// Why `auto` took this tier over one the adapter offers (on a CPU
    /// adapter, f32 over the half tiers), when it did.
    pub fn auto_reason(&self) -> Option<&str> {
        self.auto_reason.as_deref()
    }

    /// The cooperative-matrix configuration, on the matrix tier.
    pub fn matrix(&self) -> Option<MatrixConfig> {
        self.matrix
    }

    /// Whether this device's products round their operands to f16 under the
    /// range rule, so a weight's row scales are worth measuring once when
    /// it reaches the device (`measure_weight_rows`).
    pub fn measures_weight_rows(&self) -> bool {
        self.matrix.is_some_and(|c| c.operands == crate::precision::MatrixOperands::F16)
    }

    /// The cooperative-matrix configurations the adapter lists (`8×8×8 f16·f16→f32, …`).
    pub fn matrix_offered(&self) -> String {
        describe(&self.matrix_offered)
    }

    /// Fails with [`GpuError::Interrupted`] once the interrupt flag is set.
    pub fn check_interrupt(&self) -> Result<(), GpuError> {
        if self.interrupt.load(Ordering::Relaxed) { Err(GpuError::Interrupted) } else { Ok(()) }
    }

    /// Fails with the first fault the device reported (lost, out of memory, invalid use).
    pub fn check_faults(&self) -> Result<(), GpuError> {
        self.faults.check()
    }

    /// One line naming the adapter, e.g. `llvmpipe (LLVM 15.0.6, 256 bits) (Vulkan, Cpu)`.
    pub fn describe(&self) -> String {
        format!("{} ({:?}, {:?})", self.info.name, self.info.backend, self.info.device_type)
    }

    /// Whether compute passes can write GPU timestamps.
    pub fn has_timestamps(&self) -> bool {
        self.device.features().contains(wgpu::Features::TIMESTAMP_QUERY)
    }

    /// Whether the adapter is a CPU (a software driver such as lavapipe).
    pub fn is_software(&self) -> bool {
        self.info.device_type == wgpu::DeviceType::Cpu
    }

    /// Whether launchers take their kernels shaped for CPU adapters (SIMD
    /// lanes: no barriers, one row or query per invocation): on a CPU
    /// adapter unless [`GpuOptions::gpu_shaped_kernels`] asked otherwise.
    pub fn cpu_shaped_kernels(&self) -> bool {
        self.cpu_shaped
    }

    /// The subgroup size the CPU-shaped kernels read shared rows across
    /// (`attention_lanes`): a CPU adapter with subgroups of one fixed size
    /// the kernels are written for; `None` elsewhere (they then read every
    /// row in every lane).
    pub fn cpu_lanes(&self) -> Option<u32> {
        self.cpu_lanes
    }

    /// Bound in place of an absent optional input (bias, mask); never read.
    pub fn placeholder(&self) -> &wgpu::Buffer {
        &self.placeholder
    }

    /// Bound where a kernel's writable binding goes unused in a dispatch (a
    /// vector view of an output it writes element by element there); never
    /// read or written, and apart from the placeholder, which read-only
    /// bindings may hold in the same dispatch.
    pub fn unused_writable(&self) -> &wgpu::Buffer {
        &self.unused_writable
    }

    /// The buffer the range rule's row scales go to, shared by every product
    /// on this device: each product's pre-pass writes it before the product
    /// reads it, and dispatches run in order. Made once, at the size the
    /// planner allows for (`RANGE_SCALES_BYTES`: the launchers cap a
    /// product's pieces to fit), on the first matrix-tier product, so it is
    /// counted while it lives and never replaced under a prepared dispatch.
    pub(crate) fn range_scales(&self, floats: u64) -> Result<DeviceBuffer, GpuError> {
        let bytes = flux_lite_core::plan::RANGE_SCALES_BYTES;
        if floats * 4 > bytes {
            return Err(GpuError::UnsupportedShape(format!("{floats} range scales exceed the {bytes} bytes planned for them")));
        }
        Ok(lock(&self.range_scales).get_or_insert_with(|| self.storage("range scales", bytes)).clone())
    }

    /// Largest byte range one storage binding may cover.
    pub fn max_binding(&self) -> u64 {
        self.limits.max_storage_buffer_binding_size
    }

    /// Required alignment of a storage binding's offset.
    pub fn binding_alignment(&self) -> u64 {
        self.limits.min_storage_buffer_offset_alignment as u64
    }

    /// The compute pipeline for `kernel` with its override constants, built once.
    pub fn pipeline(&self, kernel: &Kernel, constants: &[(&'static str, u32)]) -> Arc<wgpu::ComputePipeline> {
        self.shaders.pipeline(&self.device, kernel, constants)
    }

    /// Device bytes allocated: live in this phase, the high-water mark, the number of buffers.
    pub fn memory(&self) -> DeviceMemory {
        let m = &self.memory;
        DeviceMemory {
            live: m.live.load(Ordering::Relaxed),
            high_water: m.high_water.load(Ordering::Relaxed),
            allocations: m.allocations.load(Ordering::Relaxed),
        }
    }

    /// The limits the memory planner lays buffers out under.
    pub fn plan_limits(&self) -> flux_lite_core::plan::DeviceLimits {
        flux_lite_core::plan::DeviceLimits {
            max_buffer: self.limits.max_buffer_size,
            max_binding: self.max_binding(),
            half_operands: self.f16_operands(),
            attention_products: flux_lite_core::ir::AttentionProducts { over_pieces: self.attention_on_products(true), over_rows: self.attention_on_products(false) },
        }
    }

}

fn storage_usage() -> wgpu::BufferUsages {
    wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST
}

/// Locks a cache; a poisoned lock only means another thread panicked mid-insert
/// of a complete value, so the map is still sound.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metal_bindings_stay_within_32_bit_bounds_checks() {
        // What wgpu reports for a 64 GB Mac's largest buffer, and for NVIDIA's Vulkan driver.
        assert_eq!(binding_limit(wgpu::Backend::Metal, 48 << 30), METAL_BINDING_LIMIT);
        assert_eq!(binding_limit(wgpu::Backend::Metal, 1 << 30), 1 << 30);
        assert_eq!(binding_limit(wgpu::Backend::Vulkan, (1 << 31) - 1), (1 << 31) - 1);
        assert_eq!(binding_limit(wgpu::Backend::Vulkan, 4 << 30), 4 << 30);
    }

    /// The emulated NVIDIA adapter's matrix tier is planned for its 48 KiB
    /// of workgroup memory whether `matrix` is named or `auto` takes it
    /// (on lavapipe only with the GPU-shaped kernels): the plan follows the
    /// tier chosen, as the tier's configuration does. The device is taken
    /// before `auto`'s proof, which checks products (Mesa 22's lavapipe
    /// gets the emulated tiles' products wrong, Mesa 26's right): this holds
    /// the planning alone.
    #[test]
    fn an_emulated_matrix_tier_is_planned_alike_named_and_under_auto() {
        let emulated = GpuOptions { emulated_matrix: Some(crate::emulated_matrix::EmulatedMatrix::NVIDIA), gpu_shaped_kernels: true, ..crate::testing::options() };
        let Some(named) = crate::testing::tier_gpu_with(GpuOptions { precision: Precision::Matrix, ..emulated.clone() }) else { return };
        let auto = Gpu::unproven(&GpuOptions { precision: Precision::Auto, ..emulated }).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(auto.precision(), Precision::Matrix, "auto took {}", auto.precision().name());
        for gpu in [&named, &auto] {
            assert_eq!(gpu.limits.max_compute_workgroup_storage_size, 48 << 10);
        }
        assert_eq!(auto.matrix(), named.matrix());
    }
}
