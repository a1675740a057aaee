//! How much memory the adapter offers, for a default budget when the caller
//! gives none: Vulkan's heap budget (`VK_EXT_memory_budget`: what this
//! process may use of the device-local heap now, other processes' use taken
//! off) or the heap's size without it; on a CPU adapter, the host memory
//! available; on Metal, the device's `recommendedMaxWorkingSetSize` (what
//! macOS lets the GPU keep resident without paging). wgpu exposes none of
//! this, so it is read through wgpu's hal.

/// What the adapter offers and where the figure came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdapterMemory {
    pub bytes: u64,
    pub source: MemorySource,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemorySource {
    /// `VK_EXT_memory_budget`'s budget of the largest device-local heap.
    VulkanHeapBudget,
    /// The largest device-local heap's size (the driver has no budget extension).
    VulkanHeapSize,
    /// `MemAvailable` of `/proc/meminfo`: a CPU adapter's buffers are host memory.
    HostAvailable,
    /// Metal's `recommendedMaxWorkingSetSize`.
    MetalWorkingSet,
}

impl MemorySource {
    pub fn describe(self) -> &'static str {
        match self {
            MemorySource::VulkanHeapBudget => "the Vulkan heap budget (VK_EXT_memory_budget)",
            MemorySource::VulkanHeapSize => "the Vulkan device-local heap's size",
            MemorySource::HostAvailable => "the host memory available (a CPU adapter)",
            MemorySource::MetalWorkingSet => "Metal's recommended working set",
        }
    }
}

/// The share of the adapter's memory a default budget leaves free, in
/// percent: for the driver, its compiled pipelines and other programs.
pub const DEFAULT_MARGIN_PERCENT: u64 = 10;

impl AdapterMemory {
    /// The budget a run takes when none is given: the adapter's memory less
    /// [`DEFAULT_MARGIN_PERCENT`].
    pub fn default_budget(&self) -> u64 {
        self.bytes - self.bytes / 100 * DEFAULT_MARGIN_PERCENT
    }
}

/// What `adapter` offers, where it can be known.
pub fn query(adapter: &wgpu::Adapter, info: &wgpu::AdapterInfo) -> Option<AdapterMemory> {
    if info.device_type == wgpu::DeviceType::Cpu {
        return host_available().map(|bytes| AdapterMemory { bytes, source: MemorySource::HostAvailable });
    }
    match info.backend {
        #[cfg(not(any(target_arch = "wasm32", target_vendor = "apple")))]
        wgpu::Backend::Vulkan => vulkan(adapter),
        #[cfg(target_vendor = "apple")]
        wgpu::Backend::Metal => metal(adapter),
        _ => None,
    }
}

/// Metal's `recommendedMaxWorkingSetSize` for the adapter's device.
#[cfg(target_vendor = "apple")]
fn metal(adapter: &wgpu::Adapter) -> Option<AdapterMemory> {
    use objc2_metal::MTLDevice;
    // SAFETY: the hal adapter is only read (one property of its device).
    let hal = unsafe { adapter.as_hal::<wgpu::hal::api::Metal>() }?;
    let bytes = hal.raw_device().recommendedMaxWorkingSetSize();
    (bytes > 0).then_some(AdapterMemory { bytes, source: MemorySource::MetalWorkingSet })
}

/// The largest device-local heap's budget (or size) of a Vulkan adapter
/// (wgpu builds its Vulkan backend everywhere but the web and Apple's systems).
#[cfg(not(any(target_arch = "wasm32", target_vendor = "apple")))]
fn vulkan(adapter: &wgpu::Adapter) -> Option<AdapterMemory> {
    use ash::vk;
    // SAFETY: the hal adapter is only read (two property queries on its
    // physical device through its own instance); nothing is created or destroyed.
    let hal = unsafe { adapter.as_hal::<wgpu::hal::api::Vulkan>() }?;
    let instance = hal.shared_instance();
    let device = hal.raw_physical_device();
    let has_budget = hal.physical_device_capabilities().supports_extension(ash::ext::memory_budget::NAME) && instance.instance_api_version() >= vk::API_VERSION_1_1;
    let mut budget = vk::PhysicalDeviceMemoryBudgetPropertiesEXT::default();
    let properties = if has_budget {
        let mut both = vk::PhysicalDeviceMemoryProperties2::default().push_next(&mut budget);
        // SAFETY: a Vulkan 1.1 instance (checked above) has this query; `both` lives through it.
        unsafe { instance.raw_instance().get_physical_device_memory_properties2(device, &mut both) };
        both.memory_properties
    } else {
        // SAFETY: a core Vulkan 1.0 query on the adapter's own physical device.
        unsafe { instance.raw_instance().get_physical_device_memory_properties(device) }
    };
    let heaps = &properties.memory_heaps[..properties.memory_heap_count as usize];
    let local = (0..heaps.len()).filter(|&i| heaps[i].flags.contains(vk::MemoryHeapFlags::DEVICE_LOCAL));
    let (bytes, source) = match has_budget {
        true => (local.map(|i| budget.heap_budget[i]).max()?, MemorySource::VulkanHeapBudget),
        false => (local.map(|i| heaps[i].size).max()?, MemorySource::VulkanHeapSize),
    };
    (bytes > 0).then_some(AdapterMemory { bytes, source })
}

/// `MemAvailable` from `/proc/meminfo` (Linux); `None` elsewhere.
fn host_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    mem_available(&text)
}

fn mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_available_is_read_in_kibibytes() {
        let text = "MemTotal:       24568196 kB\nMemFree:         1000000 kB\nMemAvailable:   20000000 kB\n";
        assert_eq!(mem_available(text), Some(20_000_000 * 1024));
        assert_eq!(mem_available("MemTotal: 1 kB\n"), None);
    }

    #[test]
    fn the_default_budget_leaves_the_stated_margin() {
        let m = AdapterMemory { bytes: 8 << 30, source: MemorySource::VulkanHeapBudget };
        assert_eq!(m.default_budget(), (8 << 30) - (8u64 << 30) / 100 * DEFAULT_MARGIN_PERCENT);
    }
}
