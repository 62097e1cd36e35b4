use super::device::Gpu;
use super::pacing::PartPacer;
use super::pipelines::Kernel;
use super::profile::Profiler;

/// Encodes a sequence of dispatches (a whole forward pass) into one command buffer, inside one
/// compute pass unless a copy or profiling needs a break. wgpu places the barriers between
/// dependent dispatches. Made with [`Recorder::in_parts`], it submits as it goes.
pub struct Recorder<'a> {
    gpu: &'a Gpu,
    encoder: wgpu::CommandEncoder,
    pass: Option<wgpu::ComputePass<'static>>,
    profiler: Option<&'a mut Profiler>,
    dispatches: u32,
    in_parts: bool,
    /// The dispatch count at which the next part is submitted (unpaced).
    next_part_at: u32,
    /// Where the device paces submissions for a window (`Gpu::pace_parts`).
    pacer: Option<PartPacer>,
    /// The submission lock, from the first part submitted until the last.
    parts_lock: Option<std::sync::MutexGuard<'a, ()>>,
}

/// Dispatches recorded before the first part of a [`Recorder::in_parts`] sequence is
/// submitted, and in each part after it.
const FIRST_PART: u32 = 16;
const PART: u32 = 64;

impl<'a> Recorder<'a> {
    pub fn new(gpu: &'a Gpu) -> Self {
        let encoder = gpu
            .device()
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("forward"),
            });
        Self {
            gpu,
            encoder,
            pass: None,
            profiler: None,
            dispatches: 0,
            in_parts: false,
            next_part_at: FIRST_PART,
            pacer: None,
            parts_lock: None,
        }
    }

    /// A recorder that submits what it has recorded after the first few dispatches, then
    /// every few dozen, so the GPU starts on a long sequence (a prompt's layers, a UNet step)
    /// while the host records the rest: the GPU waits for a command buffer's submission, and
    /// the host takes µs per dispatch, ~1 ms for a 1–2B model's prompt. For sequences with no
    /// queue writes between their dispatches (a write lands before the next part, not before
    /// the whole). The parts reach the queue together: the recorder holds the device's
    /// submission lock from its first part to its last, so no other thread's work (which may
    /// reuse the same shared scratch) lands between them. `BACKPACK_SUBMIT_PARTS=0` records
    /// whole (comparisons). Where the device paces submissions (`Gpu::pace_parts`, for a
    /// window sharing it), parts are cut by their dispatches' expected GPU time and at most
    /// two wait in the queue (see `pacing.rs`).
    pub fn in_parts(gpu: &'a Gpu) -> Self {
        let mut rec = Self::new(gpu);
        rec.in_parts = !matches!(
            std::env::var("BACKPACK_SUBMIT_PARTS")
                .as_deref()
                .map(str::trim),
            Ok("0")
        );
        if rec.in_parts
            && let Some(budget) = gpu.part_budget()
        {
            rec.pacer = Some(PartPacer::new(budget, gpu.kernel_costs()));
        }
        rec
    }

    pub(crate) fn with_profiler(gpu: &'a Gpu, profiler: Option<&'a mut Profiler>) -> Self {
        let mut rec = Self::new(gpu);
        rec.profiler = profiler;
        rec
    }

    pub fn gpu(&self) -> &Gpu {
        self.gpu
    }

    /// Dispatches `kernel` over `workgroups` (x may exceed the per-dimension limit: it is
    /// folded into y, and kernels recover the linear index from `num_workgroups`).
    pub fn dispatch(&mut self, kernel: &Kernel, bind_group: &wgpu::BindGroup, workgroups: u32) {
        let [x, y] = fold_grid(workgroups);
        self.dispatch_xyz(kernel, bind_group, [x, y, 1]);
    }

    pub fn dispatch_xyz(&mut self, kernel: &Kernel, bind_group: &wgpu::BindGroup, grid: [u32; 3]) {
        if grid.contains(&0) {
            return;
        }
        let workgroups = grid[0].saturating_mul(grid[1]).saturating_mul(grid[2]);
        let mut cut_after = false;
        let mut cost = None;
        if let Some(pacer) = self.pacer.as_ref() {
            let (cuts, expected) = pacer.cuts(&kernel.label, workgroups);
            if cuts.before {
                self.submit_so_far();
            }
            (cut_after, cost) = (cuts.after, expected);
        } else if self.in_parts && self.dispatches == self.next_part_at {
            self.submit_so_far();
        }
        self.dispatches += 1;
        if let Some(pacer) = self.pacer.as_mut() {
            pacer.record(&kernel.label, workgroups, cost);
        }
        self.encode_dispatch(kernel, bind_group, grid);
        if cut_after {
            self.submit_so_far();
        }
    }

    fn encode_dispatch(&mut self, kernel: &Kernel, bind_group: &wgpu::BindGroup, grid: [u32; 3]) {
        if let Some(profiler) = self.profiler.as_deref_mut() {
            self.pass = None;
            let writes = profiler.next(&kernel.label);
            let mut pass = self
                .encoder
                .begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: Some(&kernel.label),
                    timestamp_writes: writes,
                });
            pass.set_pipeline(&kernel.pipeline);
            pass.set_bind_group(0, bind_group, &[]);
            pass.dispatch_workgroups(grid[0], grid[1], grid[2]);
            return;
        }
        let pass = self.pass.get_or_insert_with(|| {
            self.encoder
                .begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: Some("forward"),
                    timestamp_writes: None,
                })
                .forget_lifetime()
        });
        pass.set_pipeline(&kernel.pipeline);
        pass.set_bind_group(0, bind_group, &[]);
        pass.dispatch_workgroups(grid[0], grid[1], grid[2]);
    }

    pub fn copy(
        &mut self,
        src: &wgpu::Buffer,
        src_offset: u64,
        dst: &wgpu::Buffer,
        dst_offset: u64,
        size: u64,
    ) {
        self.pass = None;
        self.encoder
            .copy_buffer_to_buffer(src, src_offset, dst, dst_offset, size);
    }

    pub fn clear(&mut self, buffer: &wgpu::Buffer) {
        self.pass = None;
        self.encoder.clear_buffer(buffer, 0, None);
    }

    /// Zeroes `size` bytes of `buffer` from `offset` (both multiples of 4).
    pub fn clear_range(&mut self, buffer: &wgpu::Buffer, offset: u64, size: u64) {
        self.pass = None;
        self.encoder.clear_buffer(buffer, offset, Some(size));
    }

    /// Number of kernel dispatches recorded so far.
    pub fn dispatches(&self) -> u32 {
        self.dispatches
    }

    /// Submits what is recorded so far and goes on recording into a fresh command buffer.
    /// Profiling records everything into one command buffer, so this does nothing there.
    fn submit_so_far(&mut self) {
        if self.profiler.is_some() {
            return;
        }
        self.pass = None;
        let fresh = self
            .gpu
            .device()
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("forward"),
            });
        let done = std::mem::replace(&mut self.encoder, fresh);
        if self.parts_lock.is_none() {
            self.parts_lock = Some(self.gpu.submit_lock());
        }
        let index = self.gpu.queue().submit([done.finish()]);
        match self.pacer.as_mut() {
            Some(pacer) => pacer.after_submit(self.gpu.device(), index),
            None => self.next_part_at = self.dispatches + PART,
        }
    }

    /// Ends encoding and submits the work in one `queue.submit`.
    pub fn submit(mut self) -> wgpu::SubmissionIndex {
        self.pass = None;
        if let Some(profiler) = self.profiler.as_deref() {
            profiler.resolve(&mut self.encoder);
        }
        match self.parts_lock.take() {
            // The parts hold the lock already: the last one goes under it.
            Some(_held) => self.gpu.queue().submit([self.encoder.finish()]),
            None => self.gpu.submit([self.encoder.finish()]),
        }
    }
}

/// Splits a workgroup count over x and y so neither exceeds the 65535 per-dimension limit.
pub fn fold_grid(workgroups: u32) -> [u32; 2] {
    const MAX: u32 = 65535;
    if workgroups <= MAX {
        [workgroups, 1]
    } else {
        let y = workgroups.div_ceil(MAX);
        [workgroups.div_ceil(y), y]
    }
}
