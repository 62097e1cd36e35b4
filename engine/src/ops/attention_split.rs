//! Attention for one decoded token with its keys split into runs across workgroups
//! (shaders/attention.wgsl SPLIT), the runs merged by the output product.

use super::{Attention, CacheShape, HeadNormGains, SplitParts};
use crate::gpu::{Gpu, GpuError, StorageBuffer, UniformBuffer};
use crate::ops::RopeTable;

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
        Self::build(
            gpu,
            shape,
            qkv,
            k_cache,
            v_cache,
            partials,
            Some(SplitParts {
                stats,
                table,
                head_norm,
            }),
            None,
            None,
            step,
        )
    }
}
