//! Attention for a few query rows over long contexts with each row's keys in runs across
//! workgroups (shaders/attention.wgsl `RUNS`), then a merge of each row's runs: a batched
//! decode step's rows (each its own sequence), or a short step of one sequence (a speculative
//! verification, a few-token prompt after a long context). A workgroup per row and head
//! would leave most of the GPU idle there.

use super::{CacheShape, MAX_SPLITS, MIN_SPLIT, SOURCE, bind, split_key_lanes, splits_for};
use crate::gpu::{Gpu, GpuError, Kernel, Recorder, StorageBuffer};

/// Steps take runs of keys where a workgroup per row and head makes at most this many
/// workgroups, and the longest row sees at least [`RUNS_FROM_KEYS`] keys. On an H200
/// (`bench --parallel 1,2,4,16`, Llama-3.1-8B's shape, 32 heads, Q4_K, runs against none in
/// one run): after a 2,000-token prompt steps of 1–4 rows took 13–25 % less time, 16 rows 3 %
/// more; after 504 tokens 1–4 rows 4–9 % less, 16 rows 4 % more; after 128 tokens (three
/// runs) 1–4 rows 5–11 % more.
const RUNS_MOST_WORKGROUPS: u32 = 256;
const RUNS_FROM_KEYS: u32 = 4 * MIN_SPLIT;

/// The most rows one dispatch of runs takes (the scratch holds their runs).
pub const RUNS_MOST_ROWS: u32 = super::super::MAX_BATCH_ROWS;

/// The runs' kernel and their merge, with the scratch the runs write.
pub(super) struct KeyRuns {
    kernel: Kernel,
    bind_group: wgpu::BindGroup,
    merge: Kernel,
    merge_group: wgpu::BindGroup,
    heads: u32,
    _parts: StorageBuffer,
    _stats: StorageBuffer,
}

impl KeyRuns {
    /// The runs' kernel and the merge, from the attention kernel's `defines` and bindings
    /// (`entries`; the runs write their outputs and statistics to scratch shared by every
    /// layer, the merge writes the attention's output).
    pub(super) fn new(
        gpu: &Gpu,
        shape: &CacheShape,
        defines: &[(&'static str, String)],
        entries: &[(u32, &wgpu::Buffer)],
    ) -> Result<Self, GpuError> {
        let key_lanes = split_key_lanes(gpu, shape.head_dim).to_string();
        let defines: Vec<(&'static str, String)> = defines
            .iter()
            .map(|(name, value)| match *name {
                "RUNS" => (*name, "1".to_owned()),
                "TILED" => (*name, "0".to_owned()),
                "KEY_LANES" => (*name, key_lanes.clone()),
                _ => (*name, value.clone()),
            })
            .collect();
        let kernel = gpu.kernel("attention", SOURCE, "main", &defines)?;
        let merge = gpu.kernel("attention", SOURCE, "merge_runs", &defines)?;
        let slots = u64::from(RUNS_MOST_ROWS * MAX_SPLITS * shape.heads);
        let parts =
            gpu.shared_scratch("attention key runs", slots * u64::from(shape.head_dim) * 4)?;
        let stats = gpu.shared_scratch("attention key run stats", slots * 8)?;
        let out = entries
            .iter()
            .find(|(binding, _)| *binding == 5)
            .map(|(_, buffer)| *buffer)
            .ok_or_else(|| GpuError::Device("attention runs without an output".into()))?;
        // The runs leave the sinks to the merge, which normalises.
        let mut run_entries: Vec<(u32, &wgpu::Buffer)> = entries
            .iter()
            .filter(|(binding, _)| ![5, 9].contains(binding))
            .copied()
            .collect();
        run_entries.extend([(5, &parts.buffer), (6, &stats.buffer)]);
        let bind_group = bind(gpu, &kernel, &run_entries);
        // The merge finds each row's position in the step (binding 1) or the batch's rows.
        let mut merge_entries: Vec<(u32, &wgpu::Buffer)> = entries
            .iter()
            .filter(|(binding, _)| [0, 1, 9, super::super::BATCH_ROWS_BINDING].contains(binding))
            .copied()
            .collect();
        merge_entries.extend([(5, out), (6, &stats.buffer), (10, &parts.buffer)]);
        let merge_group = bind(gpu, &merge, &merge_entries);
        Ok(Self {
            kernel,
            bind_group,
            merge,
            merge_group,
            heads: shape.heads,
            _parts: parts,
            _stats: stats,
        })
    }

    /// Whether `n_rows` rows, the longest of which sees `visible` keys, are better off in runs
    /// than with a workgroup per row and head.
    pub(super) fn suit(&self, n_rows: u32, visible: u32) -> bool {
        n_rows <= RUNS_MOST_ROWS
            && n_rows * self.heads <= RUNS_MOST_WORKGROUPS
            && visible >= RUNS_FROM_KEYS
            && splits_for(visible) > 1
    }

    /// Records the runs of `n_rows` rows (at most [`RUNS_MOST_ROWS`]), the longest of which
    /// sees `visible` keys, and their merge.
    pub(super) fn encode(&self, rec: &mut Recorder<'_>, n_rows: u32, visible: u32) {
        debug_assert!(n_rows <= RUNS_MOST_ROWS);
        let runs = splits_for(visible);
        rec.dispatch_xyz(&self.kernel, &self.bind_group, [self.heads, n_rows, runs]);
        rec.dispatch_xyz(&self.merge, &self.merge_group, [self.heads, n_rows, 1]);
    }
}
