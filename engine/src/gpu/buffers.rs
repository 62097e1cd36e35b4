use bytemuck::Pod;

use super::device::{Gpu, GpuError};

/// A storage buffer on the device, with its size in bytes (clones share the buffer).
#[derive(Clone)]
pub struct StorageBuffer {
    pub buffer: wgpu::Buffer,
    pub size: u64,
}

impl StorageBuffer {
    pub fn binding(&self) -> wgpu::BindingResource<'_> {
        self.buffer.as_entire_binding()
    }
}

/// A small uniform buffer holding one `Pod` parameter block.
pub struct UniformBuffer {
    pub buffer: wgpu::Buffer,
}

impl UniformBuffer {
    pub fn write<T: Pod>(&self, gpu: &Gpu, value: &T) {
        gpu.queue()
            .write_buffer(&self.buffer, 0, bytemuck::bytes_of(value));
    }
}

const STORAGE_USAGE: wgpu::BufferUsages = wgpu::BufferUsages::STORAGE
    .union(wgpu::BufferUsages::COPY_SRC)
    .union(wgpu::BufferUsages::COPY_DST);

/// Sizes are rounded up to whole `u32` words (and at least one) so every buffer can be bound
/// and copied.
fn padded(size: u64) -> u64 {
    size.max(4).div_ceil(4) * 4
}

impl Gpu {
    /// A scratch buffer of at least `size` bytes, shared by every kernel that asks under
    /// `label` on this device: for intermediates written and read back within one sequence
    /// of dispatches (the queue orders the sequences), so the layers of a model, and models,
    /// need not each hold their own. A larger request replaces the shared buffer; earlier
    /// holders keep theirs.
    pub fn shared_scratch(
        &self,
        label: &'static str,
        size: u64,
    ) -> Result<StorageBuffer, GpuError> {
        let mut pool = self
            .inner
            .scratch
            .lock()
            .map_err(|_| GpuError::Device("scratch pool poisoned".into()))?;
        if let Some(buffer) = pool.get(label)
            && buffer.size >= size
        {
            return Ok(buffer.clone());
        }
        let buffer = self.storage(label, size)?;
        pool.insert(label, buffer.clone());
        Ok(buffer)
    }

    /// A zero-filled storage buffer of `size` bytes.
    pub fn storage(&self, label: &str, size: u64) -> Result<StorageBuffer, GpuError> {
        let size = padded(size);
        self.check_binding_size(label, size)?;
        let buffer = self.device().create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size,
            usage: STORAGE_USAGE,
            mapped_at_creation: false,
        });
        Ok(StorageBuffer { buffer, size })
    }

    /// A storage buffer holding `data`.
    pub fn storage_from<T: Pod>(&self, label: &str, data: &[T]) -> Result<StorageBuffer, GpuError> {
        let bytes: &[u8] = bytemuck::cast_slice(data);
        self.storage_filled(label, bytes.len() as u64, |mut out| {
            out.slice(..bytes.len()).copy_from_slice(bytes)
        })
    }

    /// A storage buffer of `size` bytes filled from consecutive chunks, written straight into
    /// mapped memory so a large tensor is never held twice on the host.
    pub fn storage_from_chunks(
        &self,
        label: &str,
        size: u64,
        chunks: impl IntoIterator<Item = Vec<u8>>,
    ) -> Result<StorageBuffer, GpuError> {
        let mut overflow = None;
        let buffer = self.storage_filled(label, size, |mut out| {
            let mut offset = 0usize;
            for chunk in chunks {
                let end = offset + chunk.len();
                if end > out.len() {
                    overflow = Some(end);
                    return;
                }
                out.slice(offset..end).copy_from_slice(&chunk);
                offset = end;
            }
        })?;
        match overflow {
            Some(end) => Err(GpuError::Device(format!(
                "{label}: {end} bytes written into a {} byte buffer",
                buffer.size
            ))),
            None => Ok(buffer),
        }
    }

    /// A storage buffer of `size` bytes (padded to whole words) whose contents `fill` writes
    /// into mapped memory (zeroed beforehand), so weights go from the mapped file to the
    /// upload memory in one pass.
    pub fn storage_filled(
        &self,
        label: &str,
        size: u64,
        fill: impl FnOnce(wgpu::WriteOnly<'_, [u8]>),
    ) -> Result<StorageBuffer, GpuError> {
        let padded_size = padded(size);
        self.check_binding_size(label, padded_size)?;
        let buffer = self.device().create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: padded_size,
            usage: STORAGE_USAGE,
            mapped_at_creation: true,
        });
        {
            let mut view = buffer
                .get_mapped_range_mut(..)
                .map_err(|e| GpuError::Device(format!("mapping {label}: {e}")))?;
            fill(view.slice(..));
        }
        buffer.unmap();
        Ok(StorageBuffer {
            buffer,
            size: padded_size,
        })
    }

    pub fn uniform<T: Pod>(&self, label: &str, value: &T) -> UniformBuffer {
        let bytes = bytemuck::bytes_of(value);
        let buffer = self.device().create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: padded(bytes.len() as u64).max(16),
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        self.queue().write_buffer(&buffer, 0, bytes);
        UniformBuffer { buffer }
    }

    /// A buffer the host can map to read results: the only way data comes back.
    pub fn readback_buffer(&self, label: &str, size: u64) -> wgpu::Buffer {
        self.device().create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: padded(size),
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        })
    }

    /// Maps `staging` (after the copy into it was submitted), waits, and returns its contents.
    pub fn map_read<T: Pod>(&self, staging: &wgpu::Buffer, bytes: u64) -> Result<Vec<T>, GpuError> {
        self.map_read_inner(staging, bytes, None)
    }

    /// Like [`Gpu::map_read`], waiting only for `submission` so later work keeps running.
    pub fn map_read_after<T: Pod>(
        &self,
        staging: &wgpu::Buffer,
        bytes: u64,
        submission: wgpu::SubmissionIndex,
    ) -> Result<Vec<T>, GpuError> {
        self.map_read_inner(staging, bytes, Some(submission))
    }

    fn map_read_inner<T: Pod>(
        &self,
        staging: &wgpu::Buffer,
        bytes: u64,
        submission: Option<wgpu::SubmissionIndex>,
    ) -> Result<Vec<T>, GpuError> {
        let (tx, rx) = std::sync::mpsc::channel();
        staging.map_async(wgpu::MapMode::Read, 0..padded(bytes), move |r| {
            let _ = tx.send(r);
        });
        self.device()
            .poll(wgpu::PollType::Wait {
                submission_index: submission,
                timeout: None,
            })
            .map_err(|e| GpuError::Poll(e.to_string()))?;
        rx.recv()
            .map_err(|e| GpuError::Poll(e.to_string()))?
            .map_err(|e| GpuError::Poll(e.to_string()))?;
        let out = {
            let view = staging
                .get_mapped_range(0..padded(bytes))
                .map_err(|e| GpuError::Device(e.to_string()))?;
            bytemuck::pod_collect_to_vec(&view[..bytes as usize])
        };
        staging.unmap();
        Ok(out)
    }

    /// Copies `count` elements starting at element `offset` of `buffer` back to the host.
    /// Meant for tests and tools; the decode loop reads back only the sampled token.
    pub fn read<T: Pod>(
        &self,
        buffer: &wgpu::Buffer,
        offset: u64,
        count: u64,
    ) -> Result<Vec<T>, GpuError> {
        let elem = std::mem::size_of::<T>() as u64;
        let bytes = count * elem;
        let staging = self.readback_buffer("read", bytes);
        let mut encoder = self.device().create_command_encoder(&Default::default());
        encoder.copy_buffer_to_buffer(buffer, offset * elem, &staging, 0, padded(bytes));
        self.submit([encoder.finish()]);
        self.map_read(&staging, bytes)
    }
}
