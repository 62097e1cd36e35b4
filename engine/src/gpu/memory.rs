//! How much GPU memory is free. wgpu does not say; Vulkan does, through
//! `VK_EXT_memory_budget` (which wgpu enables when the driver has it): each heap's budget for
//! this process and what the process uses of it. The query is a read of the physical
//! device's properties through wgpu's raw Vulkan handles; no wgpu wrapper offers it. Other
//! backends (Metal, D3D12, GL) report nothing here.

use super::Gpu;

impl Gpu {
    /// Bytes of device-local memory this process may still allocate (its budget less what it
    /// uses, over the largest device-local heap), when the driver reports it.
    pub fn free_memory(&self) -> Option<u64> {
        vulkan_free_memory(self.device())
    }
}

#[cfg(not(any(target_vendor = "apple", target_arch = "wasm32")))]
#[allow(unsafe_code)]
fn vulkan_free_memory(device: &wgpu::Device) -> Option<u64> {
    use ash::vk;
    // SAFETY: the raw handles are used for one read-only query while `device` (which owns
    // them) is borrowed; nothing is created, destroyed or synchronised through them.
    let hal = unsafe { device.as_hal::<wgpu::hal::api::Vulkan>() }?;
    let instance = hal.shared_instance();
    if instance.instance_api_version() < vk::API_VERSION_1_1
        || !hal
            .enabled_device_extensions()
            .contains(&ash::ext::memory_budget::NAME)
    {
        return None;
    }
    let mut budget = vk::PhysicalDeviceMemoryBudgetPropertiesEXT::default();
    let mut props = vk::PhysicalDeviceMemoryProperties2::default().push_next(&mut budget);
    // SAFETY: a core Vulkan 1.1 query (checked above) on the device's own physical device,
    // writing into the structures just made.
    unsafe {
        instance
            .raw_instance()
            .get_physical_device_memory_properties2(hal.raw_physical_device(), &mut props);
    }
    let memory = props.memory_properties;
    let heaps = memory.memory_heaps_as_slice();
    free_of_heaps(
        heaps
            .iter()
            .enumerate()
            .filter(|(_, h)| h.flags.contains(vk::MemoryHeapFlags::DEVICE_LOCAL))
            .map(|(i, _)| (budget.heap_budget[i], budget.heap_usage[i])),
    )
}

#[cfg(any(target_vendor = "apple", target_arch = "wasm32"))]
fn vulkan_free_memory(_: &wgpu::Device) -> Option<u64> {
    None
}

/// The most any one heap of `(budget, usage)` leaves (allocations do not span heaps); None
/// when there is none or the driver reports no budget.
fn free_of_heaps(heaps: impl Iterator<Item = (u64, u64)>) -> Option<u64> {
    heaps
        .filter(|&(budget, _)| budget > 0)
        .map(|(budget, usage)| budget.saturating_sub(usage))
        .max()
}

#[cfg(test)]
mod tests {
    use super::free_of_heaps;

    #[test]
    fn the_roomiest_heap_counts() {
        let heaps = [(8 << 30, 3 << 30), (256 << 20, 0), (2 << 30, 4 << 30)];
        assert_eq!(free_of_heaps(heaps.into_iter()), Some(5 << 30));
        assert_eq!(free_of_heaps([(0, 0)].into_iter()), None);
        assert_eq!(free_of_heaps(std::iter::empty()), None);
    }
}
