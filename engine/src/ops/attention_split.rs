//! Attention for one decoded token with its keys split into runs across workgroups
//! (shaders/attention.wgsl SPLIT), the runs merged by the output product or, with
//! [`SplitMerge`], by each head's last run.

use super::{Attention, CacheShape, HeadNormGains, SplitParts};
use crate::gpu::{Gpu, GpuError, StorageBuffer, UniformBuffer};
use crate::ops::{Int8Handoff, RopeTable};

/// A split attention whose last run of each head merges the head's runs (shaders/attention.wgsl
/// MERGE), so that the output product reads the merged row rather than merging it itself.
#[derive(Clone, Copy)]
pub struct SplitMerge<'a> {
    /// A counter per query head, zero to start with (each step's last run sets it back).
    pub counts: &'a StorageBuffer,
    /// Where the merged row goes.
    pub out: MergedRow<'a>,
    /// A logit per head joining each softmax's denominator (GPT-OSS).
    pub sinks: Option<&'a StorageBuffer>,
}

/// The merged attention row: `heads × head_dim` f32 values, or int8 blocks in one level.
#[derive(Clone, Copy)]
pub enum MergedRow<'a> {
    F32(&'a StorageBuffer),
    Int8(&'a Int8Handoff),
}

impl Attention {
    /// Attention for one decoded token with its keys split into runs across workgroups. It
    /// reads the token's q, k and v from the fused QKV row `qkv`, applies RoPE from `table`
    /// (none: learned positions), and stores k and v in the caches. `partials` receives
    /// `[MAX_SPLITS][heads][head_dim]` unnormalised outputs and `stats` `[MAX_SPLITS][heads]`
    /// (max, sum) pairs, merged by a [`super::MatVec`] with `combine`. With `head_norm` it
    /// normalises each query and key head first (the QKV row is left as it is).
    #[allow(clippy::too_many_arguments)]
    pub fn new_split(
        gpu: &Gpu,
        shape: CacheShape,
        qkv: &StorageBuffer,
        table: Option<&RopeTable>,
        k_cache: &StorageBuffer,
        v_cache: &StorageBuffer,
        partials: &StorageBuffer,
        stats: &StorageBuffer,
        head_norm: Option<HeadNormGains<'_>>,
        step: &UniformBuffer,
    ) -> Result<Self, GpuError> {
        let parts = SplitParts {
            stats,
            table,
            head_norm,
            merge: None,
        };
        Self::split(gpu, shape, qkv, (k_cache, v_cache), partials, parts, step)
    }

    fn split(
        gpu: &Gpu,
        shape: CacheShape,
        qkv: &StorageBuffer,
        (k_cache, v_cache): (&StorageBuffer, &StorageBuffer),
        partials: &StorageBuffer,
        parts: SplitParts<'_>,
        step: &UniformBuffer,
    ) -> Result<Self, GpuError> {
        Self::build(
            gpu,
            shape,
            qkv,
            k_cache,
            v_cache,
            partials,
            Some(parts),
            None,
            None,
            step,
        )
    }

    /// [`Attention::new_split`] whose last run of each head merges the head's runs into
    /// `merge.out`, where the output product reads them (`MatVecOptions::handoff_in` for an
    /// int8 row, its input otherwise) instead of merging them in every workgroup.
    #[allow(clippy::too_many_arguments)]
    pub fn new_split_merging(
        gpu: &Gpu,
        shape: CacheShape,
        qkv: &StorageBuffer,
        table: Option<&RopeTable>,
        (k_cache, v_cache): (&StorageBuffer, &StorageBuffer),
        (partials, stats): (&StorageBuffer, &StorageBuffer),
        head_norm: Option<HeadNormGains<'_>>,
        merge: SplitMerge<'_>,
        step: &UniformBuffer,
    ) -> Result<Self, GpuError> {
        let len = shape.heads * shape.head_dim;
        if let MergedRow::Int8(h) = merge.out
            && (h.len != len || h.levels != 1 || !shape.head_dim.is_multiple_of(32))
        {
            return Err(GpuError::Device(format!(
                "merged attention rows of {len} values in int8 take heads of whole 32-value blocks and a one-level handoff of that length"
            )));
        }
        let parts = SplitParts {
            stats,
            table,
            head_norm,
            merge: Some(merge),
        };
        Self::split(gpu, shape, qkv, (k_cache, v_cache), partials, parts, step)
    }
}
