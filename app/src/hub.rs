//! What the CLI and the Models panel share about the hub: where models and the token live,
//! which files of a repo make a model, and what a model will cost on this GPU.

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};
use backpack_engine::gpu::Gpu;
use backpack_engine::hub::{
    ESTIMATE_CONTEXT, FitCheck, GpuBudget, HubClient, RepoFile, RepoListing, glob_match,
    quant_label, quant_variants, system_memory,
};

/// The models folder: `BACKPACK_MODELS_DIR`, else `models` in the data dir.
pub fn default_models_dir(data_dir: &Path) -> PathBuf {
    std::env::var_os("BACKPACK_MODELS_DIR")
        .filter(|d| !d.is_empty())
        .map_or_else(|| data_dir.join("models"), PathBuf::from)
}

/// Where a token entered in the app is kept (owner-only permissions).
pub fn token_path(data_dir: &Path) -> PathBuf {
    data_dir.join("hf_token")
}

/// A hub client: `HF_ENDPOINT` and `HF_TOKEN` first, then the token saved in the app.
pub fn client(data_dir: &Path) -> Result<HubClient> {
    client_for(data_dir, None)
}

/// As [`client`], at `endpoint` when given.
pub fn client_for(data_dir: &Path, endpoint: Option<String>) -> Result<HubClient> {
    let saved = std::fs::read_to_string(token_path(data_dir))
        .ok()
        .map(|t| t.trim().to_owned())
        .filter(|t| !t.is_empty());
    let token = std::env::var("HF_TOKEN")
        .ok()
        .filter(|t| !t.trim().is_empty())
        .or(saved);
    Ok(HubClient::new(endpoint, token)?)
}

/// Files a model folder needs besides weights: configs, tokenizer, chat template.
fn is_support_file(path: &str) -> bool {
    !path.contains('/')
        && (path.ends_with(".json") || path.ends_with(".jinja") || path == "merges.txt")
}

/// The files of `listing` to fetch: those matching `include`; else the GGUF variant `quant`;
/// else the safetensors model (weights, configs, tokenizer); else the repo's only GGUF variant.
pub fn select_files(
    listing: &RepoListing,
    include: &[String],
    quant: Option<&str>,
) -> Result<Vec<RepoFile>> {
    let variants = quant_variants(&listing.files);
    let describe = || {
        variants
            .iter()
            .map(|(q, files)| {
                format!(
                    "{q} ({})",
                    crate::units::format_bytes(files.iter().map(|f| f.size).sum())
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    let files: Vec<RepoFile> = if !include.is_empty() {
        listing
            .files
            .iter()
            .filter(|f| include.iter().any(|p| glob_match(p, &f.path)))
            .cloned()
            .collect()
    } else if let Some(q) = quant {
        match variants
            .iter()
            .find(|(label, _)| label.eq_ignore_ascii_case(q))
        {
            Some((_, files)) => files.clone(),
            None if variants.is_empty() => bail!("{} has no GGUF files", listing.repo),
            None => bail!(
                "{} has no {q} variant; it has: {}",
                listing.repo,
                describe()
            ),
        }
    } else if listing
        .files
        .iter()
        .any(|f| f.path.ends_with(".safetensors") && !f.path.contains('/'))
    {
        listing
            .files
            .iter()
            .filter(|f| {
                is_support_file(&f.path)
                    || (f.path.ends_with(".safetensors") && !f.path.contains('/'))
            })
            .cloned()
            .collect()
    } else {
        match variants.as_slice() {
            [(_, files)] => files.clone(),
            [] => bail!(
                "{} has neither safetensors nor GGUF weights; pick files with --include",
                listing.repo
            ),
            _ => bail!(
                "{} has several quantizations; pick one with --quant: {}",
                listing.repo,
                describe()
            ),
        }
    };
    if files.is_empty() {
        bail!("no files of {} match {include:?}", listing.repo);
    }
    Ok(files)
}

/// What the adapter offers; software and integrated adapters draw on system memory, discrete
/// GPUs offer the free memory their driver reports.
pub fn gpu_budget(gpu: &Gpu) -> GpuBudget {
    let info = gpu.info();
    let shared = matches!(
        info.device_type,
        eframe::wgpu::DeviceType::Cpu | eframe::wgpu::DeviceType::IntegratedGpu
    );
    GpuBudget {
        adapter: info.name.clone(),
        max_binding: gpu.caps().max_storage_binding,
        max_buffer: gpu.caps().max_buffer,
        memory: if shared {
            system_memory()
        } else {
            gpu.free_memory()
        },
    }
}

/// Sizes of a download: from the listing, with the KV cache and largest tensor estimated from
/// the repo's config.json when it has one.
pub async fn fit_for(client: &HubClient, listing: &RepoListing, files: &[RepoFile]) -> FitCheck {
    let download: u64 = files.iter().map(|f| f.size).sum();
    let weights: u64 = files
        .iter()
        .filter(|f| f.path.ends_with(".safetensors") || f.path.ends_with(".gguf"))
        .map(|f| f.size)
        .sum();
    let mut fit = FitCheck {
        download_bytes: download,
        weight_bytes: weights,
        ..Default::default()
    };
    if listing.file("config.json").is_none() {
        return fit;
    }
    let Ok(bytes) = client
        .fetch_small(&listing.repo, &listing.commit, "config.json", 1 << 20)
        .await
    else {
        return fit;
    };
    let Ok(config) = serde_json::from_slice::<serde_json::Value>(&bytes) else {
        return fit;
    };
    let num = |keys: &[&str]| {
        keys.iter()
            .find_map(|k| config.get(*k).and_then(serde_json::Value::as_u64))
    };
    let (Some(hidden), Some(layers), Some(vocab)) = (
        num(&["hidden_size", "n_embd"]),
        num(&["num_hidden_layers", "n_layer"]),
        num(&["vocab_size"]),
    ) else {
        return fit;
    };
    let heads = num(&["num_attention_heads", "n_head"]).unwrap_or(1).max(1);
    let kv_heads = num(&["num_key_value_heads"]).unwrap_or(heads);
    let head_dim = num(&["head_dim"]).unwrap_or(hidden / heads);
    let context = num(&["max_position_embeddings", "n_positions"])
        .unwrap_or(ESTIMATE_CONTEXT)
        .min(ESTIMATE_CONTEXT);
    let intermediate = num(&["intermediate_size"]).unwrap_or(4 * hidden);
    let params = vocab * hidden
        + layers
            * (2 * hidden * hidden + 2 * hidden * kv_heads * head_dim + 3 * hidden * intermediate);
    let bytes_per_param = weights as f64 / params.max(1) as f64;
    fit.kv_cache_bytes = match backpack_engine::load::DecoderSpec::from_json(&config) {
        // The engine's own reading: sliding-window layers keep rolling caches.
        Ok(spec) => backpack_engine::hub::ModelShape::of_spec(&spec).kv_cache_bytes(),
        Err(_) => 2 * layers * kv_heads * head_dim * context * 2,
    };
    fit.largest_tensor = Some(((vocab * hidden) as f64 * bytes_per_param) as u64);
    fit
}

/// GGUF variants of `listing` smaller than the chosen files that pass the GPU check.
pub fn smaller_variants(
    listing: &RepoListing,
    chosen: &[RepoFile],
    fit: &FitCheck,
    gpu: &GpuBudget,
) -> Vec<(String, u64)> {
    let chosen_size: u64 = chosen.iter().map(|f| f.size).sum();
    let chosen_label = chosen.first().and_then(|f| quant_label(&f.path));
    quant_variants(&listing.files)
        .into_iter()
        .filter(|(label, _)| Some(label) != chosen_label.as_ref())
        .map(|(label, files)| (label, files.iter().map(|f| f.size).sum::<u64>()))
        .filter(|(_, size)| *size < chosen_size)
        .filter(|(_, size)| {
            let scale = *size as f64 / chosen_size.max(1) as f64;
            FitCheck {
                download_bytes: *size,
                weight_bytes: *size,
                kv_cache_bytes: fit.kv_cache_bytes,
                largest_tensor: fit.largest_tensor.map(|t| (t as f64 * scale) as u64),
            }
            .check_gpu(gpu)
            .is_ok()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listing(paths: &[(&str, u64)]) -> RepoListing {
        RepoListing {
            repo: "o/n".into(),
            commit: "c".into(),
            gated: false,
            files: paths
                .iter()
                .map(|(p, s)| RepoFile {
                    path: (*p).into(),
                    size: *s,
                    sha256: None,
                    git_oid: None,
                })
                .collect(),
        }
    }

    fn names(files: &[RepoFile]) -> Vec<&str> {
        files.iter().map(|f| f.path.as_str()).collect()
    }

    #[test]
    fn safetensors_repos_get_weights_and_support_files() {
        let l = listing(&[
            ("config.json", 1),
            ("model.safetensors", 100),
            ("tokenizer.json", 2),
            ("onnx/model.onnx", 100),
            ("README.md", 1),
        ]);
        let files = select_files(&l, &[], None).expect("files");
        assert_eq!(
            names(&files),
            ["config.json", "model.safetensors", "tokenizer.json"]
        );
    }

    #[test]
    fn gguf_repos_need_a_quant_when_they_have_several() {
        let l = listing(&[("m-Q4_K_M.gguf", 10), ("m-Q8_0.gguf", 20)]);
        let err = select_files(&l, &[], None)
            .expect_err("ambiguous")
            .to_string();
        assert!(err.contains("--quant") && err.contains("Q4_K_M"), "{err}");
        let files = select_files(&l, &[], Some("q8_0")).expect("q8");
        assert_eq!(names(&files), ["m-Q8_0.gguf"]);
        let err = select_files(&l, &[], Some("Q2_K"))
            .expect_err("absent")
            .to_string();
        assert!(err.contains("no Q2_K variant"), "{err}");
        let files = select_files(&l, &["*Q4*".into()], None).expect("include");
        assert_eq!(names(&files), ["m-Q4_K_M.gguf"]);
    }

    #[test]
    fn smaller_variants_that_fit_are_offered() {
        let l = listing(&[("m-Q4_K_M.gguf", 100 << 20), ("m-F16.gguf", 400 << 20)]);
        let chosen = vec![l.files[1].clone()];
        let fit = FitCheck {
            download_bytes: 400 << 20,
            weight_bytes: 400 << 20,
            kv_cache_bytes: 0,
            largest_tensor: Some(200 << 20),
        };
        let gpu = GpuBudget {
            adapter: "small".into(),
            max_binding: 128 << 20,
            max_buffer: 1 << 30,
            memory: None,
        };
        assert!(fit.check_gpu(&gpu).is_err());
        assert_eq!(
            smaller_variants(&l, &chosen, &fit, &gpu),
            [("Q4_K_M".to_owned(), 100 << 20)]
        );
    }
}
