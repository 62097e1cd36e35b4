//! Prompt prefixes shared between cache slots. A server's requests often open with the same
//! tokens (a system prompt, a tool list): when one slot's cache holds such a prefix, a prompt
//! starting in another slot has those positions' keys and values copied over on the GPU
//! (a copy of each layer's rows, far cheaper than running them again) and runs only the rest.
//!
//! The rows of positions below a sequence's length are never written again while it decodes,
//! so a busy slot can lend its prefix: the copy is queued after every step already submitted.
//! A rolling sliding-window cache (position p in row p mod rows, rows = window + a prompt
//! chunk − 1) is the exception: there a slot lends a prefix only while the positions written
//! past it have not reached back over the window before its end, and only that window's rows
//! are copied (no later query sees further back).

use super::DecoderModel;
use crate::Error;
use crate::gpu::Recorder;
use crate::ops::{CacheShape, KvDType};

/// A prefix is copied only when it saves at least this many positions over what the
/// receiving slot already holds (shorter runs cost about as much to copy as to compute).
pub const MIN_SHARED_TOKENS: usize = 16;

/// `BACKPACK_SHARED_PREFIX=off` keeps each slot to its own cache (a measuring switch).
static SHARING_OFF: std::sync::LazyLock<bool> =
    std::sync::LazyLock::new(|| std::env::var("BACKPACK_SHARED_PREFIX").is_ok_and(|v| v == "off"));

/// One attention layer's KV cache, kept for copies between slots.
pub(super) struct SlotCaches {
    pub(super) shape: CacheShape,
    pub(super) k: wgpu::Buffer,
    pub(super) v: wgpu::Buffer,
}

impl DecoderModel {
    /// Whether slots may take each other's prefixes: several slots, and prompts that reuse a
    /// cached prefix.
    pub fn shares_prefixes(&self) -> bool {
        self.slots() > 1 && self.prefix_reuse && !self.kv_caches.is_empty()
    }

    /// The slot other than `to` whose cache holds the longest prefix of `ids`, and its length,
    /// when sharing it would save at least [`MIN_SHARED_TOKENS`] over what `to` holds.
    pub fn prefix_source(&self, to: u32, ids: &[u32]) -> Option<(u32, usize)> {
        if !self.shares_prefixes() || *SHARING_OFF {
            return None;
        }
        let own = self.intact_prefix(to, ids);
        (0..self.slots())
            .filter(|&s| s != to)
            .map(|s| (s, self.intact_prefix(s, ids)))
            .max_by_key(|&(s, n)| (n, std::cmp::Reverse(s)))
            .filter(|&(_, n)| n >= own + MIN_SHARED_TOKENS)
    }

    /// The prefix of `ids` slot `slot` holds, where its rolling caches (if any) still hold
    /// the window before its end: positions written past the prefix, one more for a step
    /// that may be in flight, must stay within a chunk of it.
    fn intact_prefix(&self, slot: u32, ids: &[u32]) -> usize {
        let held = self.cached_prefix(slot, ids);
        let written = if slot == self.slot {
            self.written_end
        } else {
            self.slot_states
                .get(slot as usize)
                .map_or(u32::MAX, |s| s.written_end)
        };
        let rolling = self.kv_caches.iter().any(|c| c.shape.window.is_some());
        if rolling && u64::from(written) + 1 > held as u64 + u64::from(self.chunk) {
            return 0;
        }
        held
    }

    /// Copies the keys and values of the first `tokens` positions of slot `from` into slot
    /// `to`, and makes `ids[..tokens]` (which `from` must hold) `to`'s cached prefix: a prompt
    /// there starting with them runs only the rest. `to` must hold no sequence in progress.
    pub fn share_prefix(
        &mut self,
        from: u32,
        to: u32,
        ids: &[u32],
        tokens: usize,
    ) -> Result<(), Error> {
        if !self.shares_prefixes() || from == to || from >= self.slots() || to >= self.slots() {
            return Err(Error::Invalid(format!(
                "slot {from}'s prefix cannot go to slot {to} on this model"
            )));
        }
        if tokens > ids.len() || self.intact_prefix(from, ids) < tokens {
            return Err(Error::Invalid(format!(
                "slot {from} does not hold those {tokens} tokens"
            )));
        }
        // A step of `to` still in flight would write after the copy.
        if to == self.slot {
            self.drain()?;
        }
        // A buffer cannot be copied into itself: the rows pass through a scratch buffer, all
        // of a cache buffer's ranges packed one after another.
        let ranges: Vec<_> = self
            .kv_caches
            .iter()
            .map(|c| copy_ranges(&c.shape, from, to, tokens as u32))
            .collect();
        let scratch_bytes = ranges
            .iter()
            .map(|r| r.iter().map(|&(_, _, bytes)| bytes).sum::<u64>())
            .max()
            .unwrap_or(0);
        if scratch_bytes == 0 {
            return Ok(());
        }
        let gpu = self.gpu.clone();
        let scratch = gpu.storage("shared prefix rows", scratch_bytes)?;
        let mut rec = Recorder::new(&gpu);
        for (cache, ranges) in self.kv_caches.iter().zip(&ranges) {
            for buffer in [&cache.k, &cache.v] {
                let mut at = 0;
                for &(src, _, bytes) in ranges {
                    rec.copy(buffer, src, &scratch.buffer, at, bytes);
                    at += bytes;
                }
                let mut at = 0;
                for &(_, dst, bytes) in ranges {
                    rec.copy(&scratch.buffer, at, buffer, dst, bytes);
                    at += bytes;
                }
            }
        }
        rec.submit();
        let prefix = ids[..tokens].to_vec();
        // What `to` wrote past the prefix is gone for its prompts (a rolling cache's
        // reuse is bounded by it).
        if to == self.slot {
            self.reusable = prefix;
            self.pending = None;
            self.written_end = tokens as u32;
        } else {
            let state = &mut self.slot_states[to as usize];
            state.reusable = prefix;
            state.pending = None;
            state.written_end = tokens as u32;
        }
        Ok(())
    }
}

/// The byte ranges `(from offset, to offset, bytes)` holding positions `0..tokens` of slot
/// `from` and of slot `to` in one cache buffer (for a rolling cache, the window's positions
/// before `tokens`, in rows p mod rows): each KV head's runs of rows, and for Q8_0 the runs of
/// block scales after all the values.
fn copy_ranges(shape: &CacheShape, from: u32, to: u32, tokens: u32) -> Vec<(u64, u64, u64)> {
    let (rows, hd) = (u64::from(shape.rows), u64::from(shape.head_dim));
    let row_bytes = match shape.dtype {
        KvDType::F32 => hd * 4,
        KvDType::F16 => hd * 2,
        KvDType::Q8_0 => hd,
    };
    let first_row = |slot: u32, head: u32| {
        (u64::from(slot) * u64::from(shape.kv_heads) + u64::from(head)) * rows
    };
    let mut ranges = Vec::new();
    for head in 0..shape.kv_heads {
        let (a, b) = (first_row(from, head), first_row(to, head));
        for (row, count) in row_runs(shape, tokens) {
            ranges.push((
                (a + row) * row_bytes,
                (b + row) * row_bytes,
                count * row_bytes,
            ));
            if shape.dtype == KvDType::Q8_0 {
                // One f32 scale per 32 values, rows in order, from word `scale_base`.
                let base = u64::from(shape.scale_base()) * 4;
                let scale_row = hd / 32 * 4;
                ranges.push((
                    base + (a + row) * scale_row,
                    base + (b + row) * scale_row,
                    count * scale_row,
                ));
            }
        }
    }
    ranges
}

/// The runs `(first row, rows)` of one KV head holding the positions a prompt from `tokens`
/// on may read: all before it, or for a sliding window the window − 1 before it, in rows
/// p mod rows (at most two runs).
fn row_runs(shape: &CacheShape, tokens: u32) -> Vec<(u64, u64)> {
    let rows = u64::from(shape.rows);
    let end = u64::from(tokens);
    let start = match shape.window {
        Some(w) => (end + 1).saturating_sub(u64::from(w)),
        None => 0,
    }
    .max(end.saturating_sub(rows));
    if start >= end {
        return Vec::new();
    }
    let (first, count) = (start % rows, end - start);
    if first + count <= rows {
        vec![(first, count)]
    } else {
        vec![(first, rows - first), (0, count - (rows - first))]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_cover_each_head_and_the_q8_scales() {
        let mut shape = CacheShape::new(4, 2, 64, 10, KvDType::F16);
        shape.slots = 3;
        let r = copy_ranges(&shape, 2, 0, 4);
        // Slot 2's head 1 starts at row (2·2 + 1)·10; rows of 64 f16 values.
        assert_eq!(
            r,
            vec![(40 * 128, 0, 4 * 128), (50 * 128, 10 * 128, 4 * 128)]
        );
        shape.dtype = KvDType::Q8_0;
        let r = copy_ranges(&shape, 0, 1, 3);
        let base = u64::from(shape.scale_base()) * 4;
        assert_eq!(base, 3 * 2 * 10 * 64);
        assert_eq!(r[0], (0, 20 * 64, 3 * 64));
        assert_eq!(r[1], (base, base + 20 * 8, 3 * 8));
        assert_eq!(r[3], (base + 10 * 8, base + 30 * 8, 3 * 8));
    }

    #[test]
    fn rolling_caches_copy_the_window_before_the_prefix_end() {
        // A window of 5 in 11 rows: positions 0..=10 in rows 0..=10, then round again.
        let mut shape = CacheShape::new(4, 1, 32, 11, KvDType::F32);
        shape.window = Some(5);
        assert_eq!(row_runs(&shape, 3), vec![(0, 3)]);
        // Positions 16..=19 (the window before position 20): rows 5..=8.
        assert_eq!(row_runs(&shape, 20), vec![(5, 4)]);
        // Positions 20..=23: rows 9, 10, then 0, 1.
        assert_eq!(row_runs(&shape, 24), vec![(9, 2), (0, 2)]);
        assert!(row_runs(&shape, 0).is_empty());
        shape.slots = 2;
        let r = copy_ranges(&shape, 1, 0, 24);
        assert_eq!(
            r,
            vec![(20 * 128, 9 * 128, 2 * 128), (11 * 128, 0, 2 * 128)]
        );
        // Without a window, every position below the prefix's end.
        shape.window = None;
        assert_eq!(row_runs(&shape, 7), vec![(0, 7)]);
    }
}
