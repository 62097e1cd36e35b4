//! "Will it fit?" before a byte moves: disk space for the download, the GPU's largest buffer
//! binding for the largest tensor, and memory for the weights plus the KV cache.

use std::path::{Path, PathBuf};

use thiserror::Error;

/// Room left for other files when a download would fill the disk.
const DISK_MARGIN: u64 = 256 << 20;

fn gib(bytes: u64) -> String {
    let b = bytes as f64;
    if b >= (1u64 << 30) as f64 {
        format!("{:.2} GiB", b / (1u64 << 30) as f64)
    } else {
        format!("{:.1} MiB", b / (1u64 << 20) as f64)
    }
}

/// What the GPU offers.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuBudget {
    pub adapter: String,
    pub max_binding: u64,
    pub max_buffer: u64,
    /// Memory the weights and cache can use, when known (software and integrated adapters
    /// use system memory; discrete GPUs the free memory their driver reports, where it does:
    /// see `Gpu::free_memory`).
    pub memory: Option<u64>,
}

/// What a model needs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FitCheck {
    pub download_bytes: u64,
    pub weight_bytes: u64,
    pub kv_cache_bytes: u64,
    /// The largest single tensor, when known (usually the token embedding).
    pub largest_tensor: Option<u64>,
}

#[derive(Clone, Debug, Error, PartialEq)]
pub enum FitProblem {
    #[error("not enough disk space in {}: the download needs {}, {} is free", .path.display(), gib(*.needed), gib(*.free))]
    Disk {
        path: PathBuf,
        needed: u64,
        free: u64,
    },
    #[error("its largest tensor takes {}, but {adapter} binds at most {} per buffer", gib(*.tensor), gib(*.limit))]
    Tensor {
        adapter: String,
        tensor: u64,
        limit: u64,
    },
    #[error("it needs {} for weights and KV cache, but {adapter} has {} available", gib(*.needed), gib(*.available))]
    Memory {
        adapter: String,
        needed: u64,
        available: u64,
    },
}

impl FitCheck {
    /// The first reason this model cannot be downloaded into `dir` and run on `gpu`.
    pub fn check(&self, gpu: &GpuBudget, dir: &Path) -> Result<(), FitProblem> {
        if let Some(free) = free_disk_space(dir)
            && self.download_bytes + DISK_MARGIN > free
        {
            return Err(FitProblem::Disk {
                path: dir.to_owned(),
                needed: self.download_bytes,
                free,
            });
        }
        self.check_gpu(gpu)
    }

    /// The GPU part of [`Self::check`].
    pub fn check_gpu(&self, gpu: &GpuBudget) -> Result<(), FitProblem> {
        let limit = gpu.max_binding.min(gpu.max_buffer);
        if let Some(tensor) = self.largest_tensor
            && tensor > limit
        {
            return Err(FitProblem::Tensor {
                adapter: gpu.adapter.clone(),
                tensor,
                limit,
            });
        }
        let needed = self.weight_bytes + self.kv_cache_bytes;
        if let Some(available) = gpu.memory
            && needed > available
        {
            return Err(FitProblem::Memory {
                adapter: gpu.adapter.clone(),
                needed,
                available,
            });
        }
        Ok(())
    }
}

/// Free space for `dir` (or its nearest existing ancestor).
pub fn free_disk_space(dir: &Path) -> Option<u64> {
    let mut probe = Some(dir);
    while let Some(p) = probe {
        if p.exists() {
            return fs4::available_space(p).ok();
        }
        probe = p.parent();
    }
    None
}

/// Memory available to new allocations (Linux: MemAvailable), when the system says.
pub fn system_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    info.lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(memory: Option<u64>) -> GpuBudget {
        GpuBudget {
            adapter: "test GPU".into(),
            max_binding: 128 << 20,
            max_buffer: 2 << 30,
            memory,
        }
    }

    #[test]
    fn refusals_carry_the_numbers() {
        let big_embedding = FitCheck {
            largest_tensor: Some(201 << 20),
            ..Default::default()
        };
        let e = big_embedding.check_gpu(&gpu(None)).expect_err("too big");
        assert_eq!(
            e.to_string(),
            "its largest tensor takes 201.0 MiB, but test GPU binds at most 128.0 MiB per buffer"
        );
        let heavy = FitCheck {
            weight_bytes: 3 << 30,
            kv_cache_bytes: 1 << 30,
            ..Default::default()
        };
        assert!(matches!(
            heavy.check_gpu(&gpu(Some(2 << 30))),
            Err(FitProblem::Memory { needed, .. }) if needed == 4 << 30
        ));
        assert!(heavy.check_gpu(&gpu(None)).is_ok());
        let huge_download = FitCheck {
            download_bytes: u64::MAX / 4,
            ..Default::default()
        };
        let dir = std::env::temp_dir();
        assert!(matches!(
            huge_download.check(&gpu(None), &dir),
            Err(FitProblem::Disk { .. })
        ));
        assert!(free_disk_space(&dir.join("not/yet/created")).is_some());
    }
}
