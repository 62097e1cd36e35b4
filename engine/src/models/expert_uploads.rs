//! Uploads only experts need: MXFP4 blocks from the split form published safetensors hold,
//! and 3-D expert tensors stored `[in][out]` per expert (GPT-OSS's bf16 checkpoints).

use crate::Error;
use crate::gpu::StorageBuffer;
use crate::load::GgmlType;
use crate::load::quant::mxfp4_block_from_pairs;
use crate::ops::{Matrix, WeightDType, fill_random};

use super::host_tensor::HostTensor;
use super::weights::{Uploader, WeightSource};

impl Uploader<'_> {
    /// `rows`×`cols` MXFP4 weights from a `_blocks` tensor (`[rows][cols/32][16]` bytes of
    /// e2m1 pairs) and its `_scales` (`[rows][cols/32]` e8m0 exponents), kept in blocks.
    pub fn mxfp4_matrix(
        &mut self,
        label: &str,
        blocks: &str,
        scales: &str,
        rows: u32,
        cols: u32,
    ) -> Result<Matrix, Error> {
        if !cols.is_multiple_of(32) {
            return Err(Error::Invalid(format!(
                "{label}: MXFP4 rows of {cols} values are not whole blocks"
            )));
        }
        let per_row = cols as usize / 32;
        let count = rows as usize * per_row;
        let pairs = self.tensor(blocks, &[count, 16])?;
        let exponents = self.tensor(scales, &[count])?;
        let (HostTensor::Safe { view: pairs, .. }, HostTensor::Safe { view: exps, .. }) =
            (pairs, exponents)
        else {
            return Err(Error::Invalid(format!(
                "{label}: {blocks} is read from safetensors checkpoints only"
            )));
        };
        if pairs.bytes.len() != count * 16 || exps.bytes.len() != count {
            return Err(Error::Invalid(format!(
                "{label}: {blocks} and {scales} are not bytes (U8)"
            )));
        }
        let mut data = Vec::with_capacity(count * GgmlType::Mxfp4.block_bytes());
        for (pair, &e) in pairs.bytes.chunks_exact(16).zip(exps.bytes) {
            data.extend_from_slice(&mxfp4_block_from_pairs(pair, e));
        }
        let m = Matrix::from_blocks(self.gpu, label, GgmlType::Mxfp4, &data, rows, cols)?;
        self.bytes += m.buffer.size;
        Ok(m)
    }

    /// `experts` matrices of `rows`×`cols` stacked, from a `[experts][cols][rows]` tensor
    /// (each expert stored `[in][out]`), transposed per expert while uploading.
    pub fn transposed_experts(
        &mut self,
        label: &str,
        name: &str,
        experts: u32,
        rows: u32,
        cols: u32,
    ) -> Result<Matrix, Error> {
        let (e, r, c) = (experts as usize, rows as usize, cols as usize);
        if let WeightSource::Random { .. } = self.source {
            let size = Matrix::byte_size(experts * rows, cols, self.dtype);
            let buffer = self.gpu.storage(label, size)?;
            let seed = self.next_seed();
            fill_random(
                self.gpu,
                &buffer,
                self.dtype,
                seed,
                1.0 / (c as f32).sqrt(),
                false,
            )?;
            self.bytes += size;
            return Ok(Matrix {
                buffer,
                rows: experts * rows,
                cols,
                dtype: self.dtype,
                quant: None,
            });
        }
        let stored = self.tensor(name, &[e * c, r])?.to_f32();
        let mut data = vec![0.0f32; e * r * c];
        for (x, expert) in stored.chunks_exact(r * c).enumerate() {
            let out = &mut data[x * r * c..(x + 1) * r * c];
            for (i, row) in expert.chunks_exact(r).enumerate() {
                for (j, v) in row.iter().enumerate() {
                    out[j * c + i] = *v;
                }
            }
        }
        let m = Matrix::from_f32(self.gpu, label, &data, experts * rows, cols, self.dtype)?;
        self.bytes += m.buffer.size;
        Ok(m)
    }

    /// A dense f32 matrix whatever the model's dtype (routers: their logits pick experts).
    pub fn f32_matrix(
        &mut self,
        label: &str,
        name: &str,
        rows: u32,
        cols: u32,
    ) -> Result<Matrix, Error> {
        let dtype = std::mem::replace(&mut self.dtype, WeightDType::F32);
        let parts = [super::weights::Part { name, rows, cols }];
        let m = self.dense_matrix(label, &parts, false);
        self.dtype = dtype;
        m
    }

    /// An f32 vector of `len` values from a tensor of any shape holding that many.
    pub fn flat_vector(
        &mut self,
        label: &str,
        name: &str,
        len: u32,
    ) -> Result<StorageBuffer, Error> {
        self.vector(label, &[(name, len)], None)
    }
}
