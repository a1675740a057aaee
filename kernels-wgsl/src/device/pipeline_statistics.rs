//! What the driver made of each matrix pipeline: registers, spills,
//! workgroup memory and whatever else it reports through
//! `VK_KHR_pipeline_executable_properties`.
//!
//! wgpu creates its pipelines without asking the driver to keep those
//! figures, and its device lacks the extension, so each pipeline this
//! device built is built again on a second device of the same physical
//! device: the same WGSL, overrides and SPIR-V options as wgpu's Vulkan
//! backend (naga's writer, the bounds checks, loop bounding and workgroup
//! memory as the module was created with; the features the modules need
//! enabled, robust buffer access where wgpu would have it), with
//! `CAPTURE_STATISTICS`. What differs from wgpu's own build is the
//! descriptor layout (every binding the module declares, not only those
//! the entry point reads), which does not change the code.

use super::shader_cache::PipelineKey;
use super::Gpu;
use ash::{khr, vk};
use std::collections::BTreeMap;
use std::ffi::CStr;

/// One pipeline's executables (a compute pipeline has one) as the driver reports them.
#[derive(Debug, Clone)]
pub struct PipelineStatistics {
    pub pipeline: PipelineKey,
    pub executables: Vec<Executable>,
}

/// One executable of a pipeline: its name, subgroup size and statistics.
#[derive(Debug, Clone)]
pub struct Executable {
    pub name: String,
    pub subgroup_size: u32,
    /// (name, value) as the driver names and formats them.
    pub statistics: Vec<(String, String)>,
}

/// Why no statistics came back.
#[derive(Debug, Clone, PartialEq)]
pub enum StatisticsError {
    /// The device is not a Vulkan one (Metal, DX12 and GL have no such query here).
    NotVulkan,
    /// The driver lacks what the query needs (named).
    Unsupported(String),
    /// A Vulkan call failed.
    Vulkan { call: &'static str, result: vk::Result },
    /// naga could not bring a pipeline's module to SPIR-V as wgpu does.
    Shader { pipeline: String, why: String },
}

impl std::fmt::Display for StatisticsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StatisticsError::NotVulkan => f.write_str("not a Vulkan device"),
            StatisticsError::Unsupported(what) => write!(f, "the driver lacks {what}"),
            StatisticsError::Vulkan { call, result } => write!(f, "{call} failed: {result}"),
            StatisticsError::Shader { pipeline, why } => write!(f, "{pipeline}: {why}"),
        }
    }
}

impl std::error::Error for StatisticsError {}

/// A pipeline's name in reports: module, entry point and overrides.
pub fn pipeline_name(key: &PipelineKey) -> String {
    let constants: Vec<String> = key.constants.iter().map(|(n, v)| format!("{n}={v}")).collect();
    format!("{}::{} [{}]", key.module.name(), key.entry, constants.join(" "))
}

impl Gpu {
    /// The driver's statistics of every matrix-tier pipeline this device
    /// has built so far (run the work first), each built again with
    /// `CAPTURE_STATISTICS` on a device of its own.
    pub fn matrix_pipeline_statistics(&self) -> Result<Vec<PipelineStatistics>, StatisticsError> {
        let pipelines: Vec<PipelineKey> = self.shaders.created().into_iter().filter(|k| k.module.is_matrix()).collect();
        self.rebuild_pipelines(&pipelines, true)
    }

    /// Builds `pipelines` again on a second device of this one's physical
    /// device, as [`Self::matrix_pipeline_statistics`] does, with their
    /// statistics where `capture` (which needs the extension); without,
    /// each executable list is empty: the build alone, which any Vulkan
    /// driver with the modules' features can check.
    pub(crate) fn rebuild_pipelines(&self, pipelines: &[PipelineKey], capture: bool) -> Result<Vec<PipelineStatistics>, StatisticsError> {
        // SAFETY: the hal device is only read (its instance and physical
        // device handles), and outlives `hal`'s use below.
        let hal = unsafe { self.device.as_hal::<wgpu::hal::api::Vulkan>() }.ok_or(StatisticsError::NotVulkan)?;
        let instance = hal.shared_instance().raw_instance();
        let device = SecondDevice::open(instance, hal.raw_physical_device(), capture)?;
        pipelines.iter().map(|key| device.build(key, &self.shaders.source(key.module), capture)).collect()
    }

    /// The pipelines this device has built so far.
    pub fn created_pipelines(&self) -> Vec<PipelineKey> {
        self.shaders.created()
    }
}

/// The second device, its queue-less setup and what its pipelines need.
struct SecondDevice<'i> {
    instance: &'i ash::Instance,
    device: ash::Device,
    api_version: u32,
    robust_buffer_access2: bool,
    varying_subgroups: bool,
}

fn vulkan(call: &'static str) -> impl Fn(vk::Result) -> StatisticsError {
    move |result| StatisticsError::Vulkan { call, result }
}

impl<'i> SecondDevice<'i> {
    fn open(instance: &'i ash::Instance, physical: vk::PhysicalDevice, capture: bool) -> Result<Self, StatisticsError> {
        // SAFETY (this function's calls): queries and one device creation on
        // a physical device of `instance`, with structures that live through
        // each call.
        let offered = unsafe { instance.enumerate_device_extension_properties(physical) }.map_err(vulkan("vkEnumerateDeviceExtensionProperties"))?;
        let has = |name: &CStr| offered.iter().any(|e| e.extension_name_as_c_str() == Ok(name));
        let properties = unsafe { instance.get_physical_device_properties(physical) };
        if properties.api_version < vk::API_VERSION_1_2 {
            return Err(StatisticsError::Unsupported("Vulkan 1.2 (the modules' f16 and memory model)".into()));
        }
        let statistics = has(khr::pipeline_executable_properties::NAME);
        if capture && !statistics {
            return Err(StatisticsError::Unsupported("VK_KHR_pipeline_executable_properties".into()));
        }
        let (matrices, robustness2) = (has(khr::cooperative_matrix::NAME), has(ash::ext::robustness2::NAME));
        let vulkan13 = properties.api_version >= vk::API_VERSION_1_3;

        // What the device offers, then the same structures (every offered
        // feature of each) chained again to enable it.
        let mut v11 = vk::PhysicalDeviceVulkan11Features::default();
        let mut v12 = vk::PhysicalDeviceVulkan12Features::default();
        let mut v13 = vk::PhysicalDeviceVulkan13Features::default();
        let mut coop = vk::PhysicalDeviceCooperativeMatrixFeaturesKHR::default();
        let mut robust = vk::PhysicalDeviceRobustness2FeaturesEXT::default();
        let mut executables = vk::PhysicalDevicePipelineExecutablePropertiesFeaturesKHR::default();
        {
            let mut query = vk::PhysicalDeviceFeatures2::default().push_next(&mut v11).push_next(&mut v12);
            if vulkan13 {
                query = query.push_next(&mut v13);
            }
            if matrices {
                query = query.push_next(&mut coop);
            }
            if robustness2 {
                query = query.push_next(&mut robust);
            }
            if capture {
                query = query.push_next(&mut executables);
            }
            unsafe { instance.get_physical_device_features2(physical, &mut query) };
        }
        let core = unsafe { instance.get_physical_device_features(physical) };
        let (robust_buffer_access2, varying_subgroups) = (robust.robust_buffer_access2 == vk::TRUE, vulkan13 && v13.subgroup_size_control == vk::TRUE);
        // The queried structures' chain pointers are reset before they are chained again.
        v11.p_next = std::ptr::null_mut();
        v12.p_next = std::ptr::null_mut();
        v13.p_next = std::ptr::null_mut();
        coop.p_next = std::ptr::null_mut();
        robust.p_next = std::ptr::null_mut();
        executables.p_next = std::ptr::null_mut();
        let mut extensions = Vec::new();
        let core = vk::PhysicalDeviceFeatures { robust_buffer_access: core.robust_buffer_access, shader_int64: core.shader_int64, ..Default::default() };
        let mut enable = vk::PhysicalDeviceFeatures2::default().features(core).push_next(&mut v11).push_next(&mut v12);
        if vulkan13 {
            enable = enable.push_next(&mut v13);
        }
        if matrices {
            extensions.push(khr::cooperative_matrix::NAME.as_ptr());
            enable = enable.push_next(&mut coop);
        }
        if robustness2 {
            extensions.push(ash::ext::robustness2::NAME.as_ptr());
            enable = enable.push_next(&mut robust);
        }
        if capture {
            extensions.push(khr::pipeline_executable_properties::NAME.as_ptr());
            enable = enable.push_next(&mut executables);
        }
        let families = unsafe { instance.get_physical_device_queue_family_properties(physical) };
        let family = families.iter().position(|f| f.queue_flags.contains(vk::QueueFlags::COMPUTE)).ok_or_else(|| StatisticsError::Unsupported("a compute queue".into()))?;
        let priorities = [1.0f32];
        let queues = [vk::DeviceQueueCreateInfo::default().queue_family_index(family as u32).queue_priorities(&priorities)];
        let info = vk::DeviceCreateInfo::default().queue_create_infos(&queues).enabled_extension_names(&extensions).push_next(&mut enable);
        let device = unsafe { instance.create_device(physical, &info, None) }.map_err(vulkan("vkCreateDevice"))?;
        Ok(Self { instance, device, api_version: properties.api_version, robust_buffer_access2, varying_subgroups })
    }

    /// naga's SPIR-V options as wgpu's Vulkan backend sets them for a module
    /// created with (`checked`) or without its run-time checks.
    fn spirv_options(&self, checked: bool) -> naga::back::spv::Options<'static> {
        use naga::proc::{BoundsCheckPolicies, BoundsCheckPolicy as P};
        let lang_version = if self.api_version >= vk::API_VERSION_1_3 { (1, 6) } else { (1, 5) };
        let bounds_check_policies = match checked {
            true => BoundsCheckPolicies {
                index: P::Restrict,
                buffer: if self.robust_buffer_access2 { P::Unchecked } else { P::Restrict },
                image_load: P::Restrict,
                binding_array: P::Unchecked,
            },
            false => BoundsCheckPolicies { index: P::Unchecked, buffer: P::Unchecked, image_load: P::Unchecked, binding_array: P::Unchecked },
        };
        naga::back::spv::Options {
            lang_version,
            flags: naga::back::spv::WriterFlags::empty(),
            capabilities: None,
            bounds_check_policies,
            // The pipelines are created with `zero_initialize_workgroup_memory: false`.
            zero_initialize_workgroup_memory: naga::back::spv::ZeroInitializeWorkgroupMemoryMode::None,
            force_loop_bounding: checked,
            emit_int_div_checks: checked,
            ..Default::default()
        }
    }

    /// `key`'s SPIR-V as wgpu writes it from `source`.
    fn spirv(&self, key: &PipelineKey, source: &str) -> Result<(Vec<u32>, naga::Module), StatisticsError> {
        let name = pipeline_name(key);
        let shader = |why: String| StatisticsError::Shader { pipeline: name.clone(), why };
        let module = naga::front::wgsl::parse_str(source).map_err(|e| shader(e.message().to_string()))?;
        let info = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), key.module.naga_capabilities()).validate(&module).map_err(|e| shader(e.as_inner().to_string()))?;
        let constants: naga::back::PipelineConstants = key.constants.iter().map(|&(n, v)| (n.to_string(), v as f64)).collect();
        let (module, info) = naga::back::pipeline_constants::process_overrides(&module, &info, Some((naga::ShaderStage::Compute, key.entry)), &constants).map_err(|e| shader(e.to_string()))?;
        let options = self.spirv_options(!key.module.indices_clamped_in_shader());
        let stage = naga::back::spv::PipelineOptions { shader_stage: naga::ShaderStage::Compute, entry_point: key.entry.to_string() };
        let words = naga::back::spv::write_vec(&module, &info, &options, Some(&stage)).map_err(|e| shader(e.to_string()))?;
        Ok((words, module.into_owned()))
    }

    /// Builds `key`'s pipeline, its statistics read where `capture`, and
    /// destroys it again.
    fn build(&self, key: &PipelineKey, source: &str, capture: bool) -> Result<PipelineStatistics, StatisticsError> {
        let (words, module) = self.spirv(key, source)?;
        let mut made = Made::new(&self.device);
        // SAFETY (this function's calls): objects created on `self.device`
        // from structures that live through each call, destroyed by `made`
        // (in reverse order) before it returns.
        let sets = descriptor_sets(&module);
        for bindings in &sets {
            let info = vk::DescriptorSetLayoutCreateInfo::default().bindings(bindings);
            made.set_layouts.push(unsafe { self.device.create_descriptor_set_layout(&info, None) }.map_err(vulkan("vkCreateDescriptorSetLayout"))?);
        }
        let info = vk::PipelineLayoutCreateInfo::default().set_layouts(&made.set_layouts);
        made.layout = unsafe { self.device.create_pipeline_layout(&info, None) }.map_err(vulkan("vkCreatePipelineLayout"))?;
        let info = vk::ShaderModuleCreateInfo::default().code(&words);
        made.shader = unsafe { self.device.create_shader_module(&info, None) }.map_err(vulkan("vkCreateShaderModule"))?;
        let entry = std::ffi::CString::new(key.entry).map_err(|e| StatisticsError::Shader { pipeline: pipeline_name(key), why: e.to_string() })?;
        // wgpu lets the subgroup size vary where it enables subgroups (the matrix kernels do).
        let stage_flags = if self.varying_subgroups { vk::PipelineShaderStageCreateFlags::ALLOW_VARYING_SUBGROUP_SIZE } else { vk::PipelineShaderStageCreateFlags::empty() };
        let stage = vk::PipelineShaderStageCreateInfo::default().flags(stage_flags).stage(vk::ShaderStageFlags::COMPUTE).module(made.shader).name(&entry);
        let flags = if capture { vk::PipelineCreateFlags::CAPTURE_STATISTICS_KHR } else { vk::PipelineCreateFlags::empty() };
        let info = [vk::ComputePipelineCreateInfo::default().flags(flags).stage(stage).layout(made.layout)];
        let pipelines = unsafe { self.device.create_compute_pipelines(vk::PipelineCache::null(), &info, None) }.map_err(|(_, result)| vulkan("vkCreateComputePipelines")(result))?;
        made.pipeline = pipelines.first().copied().unwrap_or_default();
        let executables = if capture { self.executables(made.pipeline)? } else { Vec::new() };
        Ok(PipelineStatistics { pipeline: key.clone(), executables })
    }

    /// Every executable of `pipeline`, with its statistics.
    fn executables(&self, pipeline: vk::Pipeline) -> Result<Vec<Executable>, StatisticsError> {
        let query = khr::pipeline_executable_properties::Device::new(self.instance, &self.device);
        // SAFETY: queries on a pipeline of `self.device` created with CAPTURE_STATISTICS.
        let properties = unsafe { query.get_pipeline_executable_properties(&vk::PipelineInfoKHR::default().pipeline(pipeline)) }.map_err(vulkan("vkGetPipelineExecutablePropertiesKHR"))?;
        let mut out = Vec::new();
        for (index, p) in properties.iter().enumerate() {
            let info = vk::PipelineExecutableInfoKHR::default().pipeline(pipeline).executable_index(index as u32);
            // SAFETY: as above, for an executable index the driver listed.
            let statistics = unsafe { query.get_pipeline_executable_statistics(&info) }.map_err(vulkan("vkGetPipelineExecutableStatisticsKHR"))?;
            out.push(Executable {
                name: text(p.name_as_c_str()),
                subgroup_size: p.subgroup_size,
                statistics: statistics.iter().map(|s| (text(s.name_as_c_str()), value(s))).collect(),
            });
        }
        Ok(out)
    }
}

impl Drop for SecondDevice<'_> {
    fn drop(&mut self) {
        // SAFETY: every object made on the device was destroyed with its `Made`.
        unsafe { self.device.destroy_device(None) };
    }
}

/// The objects one build made, destroyed when it ends (whatever its result).
struct Made<'d> {
    device: &'d ash::Device,
    set_layouts: Vec<vk::DescriptorSetLayout>,
    layout: vk::PipelineLayout,
    shader: vk::ShaderModule,
    pipeline: vk::Pipeline,
}

impl<'d> Made<'d> {
    fn new(device: &'d ash::Device) -> Self {
        Self { device, set_layouts: Vec::new(), layout: vk::PipelineLayout::null(), shader: vk::ShaderModule::null(), pipeline: vk::Pipeline::null() }
    }
}

impl Drop for Made<'_> {
    fn drop(&mut self) {
        // SAFETY: each handle is null or was made on `device` and is used by
        // nothing else; destroying a null handle is a no-op.
        unsafe {
            self.device.destroy_pipeline(self.pipeline, None);
            self.device.destroy_shader_module(self.shader, None);
            self.device.destroy_pipeline_layout(self.layout, None);
            for &l in &self.set_layouts {
                self.device.destroy_descriptor_set_layout(l, None);
            }
        }
    }
}

/// The descriptor set layouts a module's buffers take: set by set (up to
/// the highest it uses, empty ones between), each binding a uniform or a
/// storage buffer seen by the compute stage.
fn descriptor_sets(module: &naga::Module) -> Vec<Vec<vk::DescriptorSetLayoutBinding<'static>>> {
    let mut sets: BTreeMap<u32, Vec<vk::DescriptorSetLayoutBinding<'static>>> = BTreeMap::new();
    for (_, var) in module.global_variables.iter() {
        let Some(binding) = &var.binding else { continue };
        let kind = match var.space {
            naga::AddressSpace::Uniform => vk::DescriptorType::UNIFORM_BUFFER,
            naga::AddressSpace::Storage { .. } => vk::DescriptorType::STORAGE_BUFFER,
            _ => continue,
        };
        let entry = vk::DescriptorSetLayoutBinding::default().binding(binding.binding).descriptor_type(kind).descriptor_count(1).stage_flags(vk::ShaderStageFlags::COMPUTE);
        sets.entry(binding.group).or_default().push(entry);
    }
    let count = sets.keys().next_back().map_or(0, |&g| g + 1);
    (0..count).map(|g| sets.remove(&g).unwrap_or_default()).collect()
}

fn text(name: Result<&CStr, std::ffi::FromBytesUntilNulError>) -> String {
    name.map_or_else(|_| "?".to_string(), |s| s.to_string_lossy().into_owned())
}

/// A statistic's value as its format says to read it.
fn value(s: &vk::PipelineExecutableStatisticKHR<'_>) -> String {
    // SAFETY: the union is read as the member its format names.
    unsafe {
        match s.format {
            vk::PipelineExecutableStatisticFormatKHR::BOOL32 => (s.value.b32 != 0).to_string(),
            vk::PipelineExecutableStatisticFormatKHR::INT64 => s.value.i64.to_string(),
            vk::PipelineExecutableStatisticFormatKHR::UINT64 => s.value.u64.to_string(),
            vk::PipelineExecutableStatisticFormatKHR::FLOAT64 => format!("{:.3}", s.value.f64),
            other => format!("(format {other:?})"),
        }
    }
}

#[cfg(test)]
mod tests;
