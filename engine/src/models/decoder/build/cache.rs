//! The shape of each layer's KV cache, which the build allocates and the slot count is sized
//! by.

use crate::load::DecoderSpec;
use crate::ops::{CacheShape, KvDType};

/// Layer `i`'s cache over `slots` sequences: the whole context, or for a sliding-window layer
/// a rolling cache of the window plus one prompt chunk (what one submission stores before
/// attending).
pub(in crate::models::decoder) fn cache_shape(
    spec: &DecoderSpec,
    i: u32,
    (capacity, chunk): (u32, u32),
    kv_dtype: KvDType,
    slots: u32,
) -> CacheShape {
    let mut shape = CacheShape::new(spec.heads, spec.kv_heads, spec.head_dim, capacity, kv_dtype);
    shape.scale = spec.attn_scale;
    shape.gated_queries = spec.output_gate;
    shape.slots = slots;
    if let Some(w) = spec.window.as_ref().filter(|_| spec.is_local(i)) {
        let rows = w.size.saturating_add(chunk - 1);
        if rows < capacity {
            shape.rows = rows;
            shape.window = Some(w.size);
        } else if w.size < capacity {
            shape.window = Some(w.size);
        }
    }
    shape
}
