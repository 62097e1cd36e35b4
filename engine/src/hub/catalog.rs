//! The curated catalog shipped in `assets/catalog.json`: models known to run well, each with the
//! variants (repo, files, quantization) to fetch and the shape needed to say what it costs.

use serde::Deserialize;

use super::{FitCheck, HubError, RepoFile, RepoListing};

const BUILTIN: &str = include_str!("../../../assets/catalog.json");
/// Context length the memory estimates assume.
pub const ESTIMATE_CONTEXT: u64 = 4096;

#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct ModelShape {
    pub layers: u64,
    pub hidden: u64,
    pub vocab: u64,
    pub kv_heads: u64,
    pub head_dim: u64,
    pub tied: bool,
    /// The model's own context limit, when below [`ESTIMATE_CONTEXT`].
    #[serde(default)]
    pub context: Option<u64>,
    /// Sliding-window attention: the window of the local layers (Gemma 3, Mistral).
    #[serde(default)]
    pub sliding_window: Option<u64>,
    /// Layers attending to the whole context when the others use the window (all when absent).
    #[serde(default)]
    pub global_layers: Option<u64>,
    /// Layers keeping a KV cache when the others are linear-attention layers with a state of
    /// fixed size (Qwen3.5's Gated DeltaNet layers; all when absent).
    #[serde(default)]
    pub attention_layers: Option<u64>,
    /// The linear-attention layers' state: the same at every context length.
    #[serde(default)]
    pub state_bytes: Option<u64>,
}

/// Tokens a prompt submission stores at once: rolling caches hold the window plus these.
const PROMPT_CHUNK: u64 = 512;

impl ModelShape {
    /// The shape of a decoder the engine can describe (an HF config), sliding windows included.
    pub fn of_spec(spec: &crate::load::DecoderSpec) -> Self {
        let window = spec.window.as_ref();
        Self {
            layers: u64::from(spec.layers),
            hidden: u64::from(spec.hidden),
            vocab: u64::from(spec.vocab),
            kv_heads: u64::from(spec.kv_heads),
            head_dim: u64::from(spec.head_dim),
            tied: spec.tied_embeddings,
            context: Some(u64::from(spec.max_positions)),
            sliding_window: window.map(|w| u64::from(w.size)),
            global_layers: window.map(|w| w.local.iter().filter(|l| !**l).count() as u64),
            attention_layers: spec
                .linear
                .as_ref()
                .map(|l| l.linear.iter().filter(|linear| !**linear).count() as u64),
            state_bytes: spec.linear.as_ref().map(|l| {
                let per_layer = 4 * (l.shape.state_values() + l.shape.conv_state_values());
                per_layer * l.linear.iter().filter(|linear| **linear).count() as u64
            }),
        }
    }

    /// f16 K and V for every attention layer at the estimate's context (sliding-window layers
    /// keep a rolling cache of the window plus one prompt chunk), and the linear-attention
    /// layers' fixed state.
    pub fn kv_cache_bytes(&self) -> u64 {
        let context = self
            .context
            .unwrap_or(ESTIMATE_CONTEXT)
            .min(ESTIMATE_CONTEXT);
        let per_position = 2 * self.kv_heads * self.head_dim * 2;
        let cached = self
            .attention_layers
            .unwrap_or(self.layers)
            .min(self.layers);
        let (global, local_rows) = match self.sliding_window {
            Some(window) => (
                self.global_layers.unwrap_or(0).min(cached),
                (window + PROMPT_CHUNK - 1).min(context),
            ),
            None => (cached, 0),
        };
        per_position * (global * context + (cached - global) * local_rows)
            + self.state_bytes.unwrap_or(0)
    }
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct CatalogVariant {
    pub label: String,
    pub repo: String,
    #[serde(default = "main_branch")]
    pub revision: String,
    /// File names or `*` patterns (not crossing `/`, case-insensitive).
    pub files: Vec<String>,
    pub bits_per_weight: f64,
    /// The largest tensor's size where the embedding at `bits_per_weight` is not it (an
    /// MXFP4 checkpoint keeps its embedding in bf16).
    #[serde(default)]
    pub largest_tensor_bytes: Option<u64>,
}

fn main_branch() -> String {
    "main".into()
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct CatalogEntry {
    pub id: String,
    pub name: String,
    /// chat, speech or image.
    pub task: String,
    pub license: String,
    pub parameters: u64,
    /// Mixture-of-experts models: the parameters one token reads (the rest are experts it is
    /// not routed to); all of them must still fit in GPU memory.
    #[serde(default)]
    pub active_parameters: Option<u64>,
    /// The repo asks users to accept a license: downloading needs a token.
    pub gated: bool,
    pub shape: ModelShape,
    pub variants: Vec<CatalogVariant>,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct Catalog {
    pub models: Vec<CatalogEntry>,
}

/// `*` matches any run of characters except `/`; comparison ignores ASCII case.
pub fn glob_match(pattern: &str, path: &str) -> bool {
    fn go(p: &[u8], s: &[u8]) -> bool {
        match p.split_first() {
            None => s.is_empty(),
            Some((b'*', rest)) => (0..=s.len())
                .take_while(|&i| i == 0 || s[i - 1] != b'/')
                .any(|i| go(rest, &s[i..])),
            Some((c, rest)) => s
                .split_first()
                .is_some_and(|(d, srest)| c.eq_ignore_ascii_case(d) && go(rest, srest)),
        }
    }
    go(pattern.as_bytes(), path.as_bytes())
}

impl CatalogVariant {
    /// The files of `listing` this variant fetches.
    pub fn select(&self, listing: &RepoListing) -> Vec<RepoFile> {
        listing
            .files
            .iter()
            .filter(|f| self.files.iter().any(|p| glob_match(p, &f.path)))
            .cloned()
            .collect()
    }
}

impl CatalogEntry {
    /// Sizes from the shape and the variant's bits per weight (before the repo is listed).
    pub fn estimate(&self, variant: &CatalogVariant) -> FitCheck {
        let weights = (self.parameters as f64 * variant.bits_per_weight / 8.0) as u64;
        let embedding = self.shape.vocab * self.shape.hidden;
        FitCheck {
            download_bytes: weights,
            weight_bytes: weights,
            kv_cache_bytes: self.shape.kv_cache_bytes(),
            largest_tensor: Some(
                variant
                    .largest_tensor_bytes
                    .unwrap_or((embedding as f64 * variant.bits_per_weight / 8.0) as u64),
            ),
        }
    }

    /// Parameters one token reads, in words: "20.9 B" or, for mixture-of-experts models,
    /// "20.9 B, 3.6 B active".
    pub fn parameters_label(&self) -> String {
        let b = |n: u64| {
            if n >= 1_000_000_000 {
                format!("{:.1} B", n as f64 / 1e9)
            } else {
                format!("{:.0} M", n as f64 / 1e6)
            }
        };
        match self.active_parameters {
            Some(active) => format!("{} parameters, {} active", b(self.parameters), b(active)),
            None => format!("{} parameters", b(self.parameters)),
        }
    }

    /// The estimate with the real download size once the files are known.
    pub fn measured(&self, variant: &CatalogVariant, files: &[RepoFile]) -> FitCheck {
        let bytes: u64 = files.iter().map(|f| f.size).sum();
        let estimate = self.estimate(variant);
        let scale = bytes as f64 / estimate.weight_bytes.max(1) as f64;
        FitCheck {
            download_bytes: bytes,
            weight_bytes: bytes,
            kv_cache_bytes: estimate.kv_cache_bytes,
            largest_tensor: estimate
                .largest_tensor
                .map(|t| (t as f64 * scale.min(1.5)) as u64),
        }
    }
}

impl Catalog {
    pub fn builtin() -> Self {
        // The file is part of the build and checked by a test.
        Self::parse(BUILTIN).unwrap_or(Catalog { models: Vec::new() })
    }

    pub fn parse(text: &str) -> Result<Self, HubError> {
        serde_json::from_str(text).map_err(|e| HubError::Invalid(format!("catalog: {e}")))
    }

    pub fn entry(&self, id: &str) -> Option<&CatalogEntry> {
        self.models.iter().find(|m| m.id == id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_catalog_parses_and_is_complete() {
        let catalog = Catalog::parse(BUILTIN).expect("assets/catalog.json parses");
        for id in [
            "smollm2-135m-instruct",
            "smollm2-360m-instruct",
            "smollm2-1.7b-instruct",
            "qwen2.5-0.5b-instruct",
            "qwen2.5-1.5b-instruct",
            "llama-3.2-1b-instruct",
            "llama-3.2-3b-instruct",
            "qwen3-0.6b",
            "qwen3-1.7b",
            "qwen3-4b",
            "gemma-3-1b-it",
            "gemma-3-4b-it",
            "phi-4-mini-instruct",
            "mistral-7b-instruct-v0.3",
            "gpt2",
            "gpt-oss-20b",
            "qwen3-30b-a3b",
            "qwen3-coder-30b-a3b-instruct",
            "qwen3.5-0.8b",
            "qwen3.5-2b",
            "qwen3.5-4b",
            "qwen3.5-9b",
            "qwen3.5-35b-a3b",
            "z-image-turbo",
            "z-image",
            "flux.2-klein-4b",
            "flux.2-klein-base-4b",
            "taesd",
            "taesdxl",
            "taef1",
            "taef2",
        ] {
            let e = catalog
                .entry(id)
                .unwrap_or_else(|| panic!("{id} in the catalog"));
            assert!(!e.variants.is_empty());
            for v in &e.variants {
                assert!(super::super::valid_repo_id(&v.repo), "{}", v.repo);
            }
        }
        assert!(catalog.entry("llama-3.2-1b-instruct").expect("llama").gated);
        // SmolLM2-135M Q8_0: ~143 MB of weights, 90 MiB of f16 KV cache at 4096 tokens.
        let smol = catalog.entry("smollm2-135m-instruct").expect("smol");
        let est = smol.estimate(&smol.variants[0]);
        assert_eq!(est.kv_cache_bytes, 2 * 30 * 3 * 64 * 4096 * 2);
        // Gemma 3 1B: 4 of 26 layers see the whole context, the rest a window of 512.
        let gemma = catalog.entry("gemma-3-1b-it").expect("gemma");
        assert_eq!(
            gemma.shape.kv_cache_bytes(),
            2 * 256 * 2 * (4 * 4096 + 22 * (512 + 511))
        );
        assert!((140_000_000..150_000_000).contains(&est.weight_bytes));
        // GPT-OSS-20B: all 21 B parameters are resident, 3.6 B are read per token; its
        // largest tensor is the bf16 embedding, not an MXFP4 expert stack.
        let oss = catalog.entry("gpt-oss-20b").expect("gpt-oss");
        assert_eq!(oss.parameters_label(), "20.9 B parameters, 3.6 B active");
        let mxfp4 = oss.estimate(&oss.variants[0]);
        assert_eq!(mxfp4.largest_tensor, Some(201_088 * 2880 * 2));
        assert!((12 << 30..15 << 30).contains(&mxfp4.weight_bytes));
        // Z-Image-Turbo: the 6.2 B transformer, Qwen3-4B and the VAE, in bf16; its largest
        // tensor is the text encoder's embedding.
        let z = catalog.entry("z-image-turbo").expect("z-image-turbo");
        let bf16 = z.estimate(&z.variants[0]);
        assert_eq!(bf16.largest_tensor, Some(151_936 * 2560 * 2));
        assert!((19 << 30..21 << 30).contains(&bf16.weight_bytes));
        // FLUX.2 klein 4B: the 3.9 B transformer, Qwen3-4B and the VAE, in bf16.
        let klein = catalog.entry("flux.2-klein-4b").expect("flux.2-klein-4b");
        let bf16 = klein.estimate(&klein.variants[0]);
        assert!((14 << 30..16 << 30).contains(&bf16.weight_bytes));
        // Qwen3.5-9B: 8 of 32 layers keep a KV cache (4 heads of 256), the 24 Gated
        // DeltaNet layers 32 heads of 128×128 f32 state and a 3-input convolution state each.
        let q9 = catalog.entry("qwen3.5-9b").expect("qwen3.5-9b");
        let state = 24 * 4 * (32 * 128 * 128 + 3 * (2 * 16 * 128 + 32 * 128));
        assert_eq!(
            q9.shape.kv_cache_bytes(),
            2 * 4 * 256 * 2 * 8 * 4096 + state
        );
    }

    #[test]
    fn patterns_match_names_not_folders() {
        assert!(glob_match(
            "*q4_k_m.gguf",
            "qwen2.5-0.5b-instruct-Q4_K_M.gguf"
        ));
        assert!(glob_match("*.json", "config.json"));
        assert!(!glob_match("*.json", "onnx/config.json"));
        assert!(!glob_match("*-Q8_0.gguf", "model-Q8_0.gguf.part"));
        assert!(glob_match("model.safetensors", "model.safetensors"));
    }
}
