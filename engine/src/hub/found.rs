//! Models already on this machine, put there by other tools, shown without copying them:
//! - the Hugging Face cache (`huggingface_hub`'s layout: `models--ORG--NAME/snapshots/REV/…`,
//!   files as links into `blobs/`, the branch's commit in `refs/main`), found through
//!   `HF_HUB_CACHE`, else `HF_HOME/hub`, else `XDG_CACHE_HOME/huggingface/hub`, else
//!   `~/.cache/huggingface/hub`, as `huggingface_hub` looks it up;
//! - LM Studio's models folder (`~/.lmstudio/models/PUBLISHER/MODEL/*.gguf`, and the older
//!   `~/.cache/lm-studio/models`);
//! - Ollama's store (`OLLAMA_MODELS`, else `~/.ollama/models`): a manifest per `name:tag` under
//!   `manifests/HOST/NAMESPACE/NAME/TAG` whose `application/vnd.ollama.image.model` layer names
//!   the GGUF blob `blobs/sha256-HEX`.

use std::path::{Path, PathBuf};

use serde_json::Value;

/// Where a found model lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FoundSource {
    HuggingFaceCache,
    LmStudio,
    Ollama,
}

impl FoundSource {
    pub fn label(self) -> &'static str {
        match self {
            Self::HuggingFaceCache => "Hugging Face cache",
            Self::LmStudio => "LM Studio",
            Self::Ollama => "Ollama",
        }
    }
}

/// A model another tool put on this machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FoundModel {
    pub source: FoundSource,
    /// `org/name` for the hub cache; `publisher/model/file.gguf` for LM Studio; `name:tag` for
    /// Ollama.
    pub name: String,
    /// What `--model` opens: a folder or a `.gguf` file.
    pub path: PathBuf,
    pub size: u64,
}

/// The folders searched.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SearchRoots {
    pub hf_cache: Option<PathBuf>,
    pub lm_studio: Vec<PathBuf>,
    pub ollama: Option<PathBuf>,
}

/// The most entries looked at in one folder: a cache of thousands of repos is listed in part
/// rather than stalling the window.
const MAX_ENTRIES: usize = 4096;

fn env_path(name: &str) -> Option<PathBuf> {
    std::env::var_os(name)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

impl SearchRoots {
    /// The folders the tools use on this machine, from their environment variables and the
    /// home folder.
    pub fn from_env() -> Self {
        let home = env_path("HOME").or_else(|| env_path("USERPROFILE"));
        let hf_cache = env_path("HF_HUB_CACHE")
            .or_else(|| env_path("HUGGINGFACE_HUB_CACHE"))
            .or_else(|| env_path("HF_HOME").map(|h| h.join("hub")))
            .or_else(|| env_path("XDG_CACHE_HOME").map(|c| c.join("huggingface/hub")))
            .or_else(|| home.as_ref().map(|h| h.join(".cache/huggingface/hub")));
        let lm_studio = home
            .iter()
            .flat_map(|h| {
                [
                    h.join(".lmstudio/models"),
                    h.join(".cache/lm-studio/models"),
                ]
            })
            .collect();
        let ollama = env_path("OLLAMA_MODELS").or_else(|| home.map(|h| h.join(".ollama/models")));
        Self {
            hf_cache,
            lm_studio,
            ollama,
        }
    }

    /// Every model found, by source, then name.
    pub fn find(&self) -> Vec<FoundModel> {
        let mut found = Vec::new();
        if let Some(cache) = &self.hf_cache {
            found.extend(hf_cache(cache));
        }
        for root in &self.lm_studio {
            found.extend(lm_studio(root));
        }
        if let Some(root) = &self.ollama {
            found.extend(ollama(root));
        }
        found
    }
}

fn entries(dir: &Path) -> Vec<PathBuf> {
    let Ok(read) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut paths: Vec<PathBuf> = read
        .filter_map(Result::ok)
        .take(MAX_ENTRIES)
        .map(|e| e.path())
        .collect();
    paths.sort();
    paths
}

fn name_of(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Bytes of a file or a folder's files, following links (the hub cache's files are links).
/// Folders nest at most a few levels in these layouts; the bound keeps a link loop finite.
fn size_of(path: &Path) -> u64 {
    fn walk(path: &Path, depth: u32) -> u64 {
        if path.is_file() {
            return std::fs::metadata(path).map_or(0, |m| m.len());
        }
        if depth == 0 {
            return 0;
        }
        entries(path).iter().map(|p| walk(p, depth - 1)).sum()
    }
    walk(path, 8)
}

fn is_gguf(path: &Path) -> bool {
    path.is_file()
        && path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
}

/// The snapshot of a cached repo to show: the one `refs/main` names, else the newest.
fn cached_snapshot(repo_dir: &Path) -> Option<PathBuf> {
    let snapshots = repo_dir.join("snapshots");
    if let Ok(commit) = std::fs::read_to_string(repo_dir.join("refs/main")) {
        let commit = commit.trim();
        let dir = snapshots.join(commit);
        if !commit.is_empty() && !commit.contains(['/', '\\']) && dir.is_dir() {
            return Some(dir);
        }
    }
    entries(&snapshots)
        .into_iter()
        .filter(|p| p.is_dir())
        .max_by_key(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
}

/// A folder the engine can open whole: a transformers model with its weights, a Whisper model,
/// or a diffusers pipeline.
fn is_model_folder(dir: &Path) -> bool {
    let has_weights = entries(dir).iter().any(|p| {
        p.is_file()
            && p.extension()
                .is_some_and(|e| e.eq_ignore_ascii_case("safetensors"))
    });
    (dir.join("config.json").is_file() && has_weights) || dir.join("model_index.json").is_file()
}

fn hf_cache(cache: &Path) -> Vec<FoundModel> {
    let mut found = Vec::new();
    for repo_dir in entries(cache) {
        let Some(rest) = name_of(&repo_dir)
            .strip_prefix("models--")
            .map(str::to_owned)
        else {
            continue;
        };
        let Some(snapshot) = cached_snapshot(&repo_dir) else {
            continue;
        };
        // huggingface_hub writes `org/name` as `models--org--name`.
        let name = rest.replacen("--", "/", 1);
        if is_model_folder(&snapshot) {
            found.push(FoundModel {
                source: FoundSource::HuggingFaceCache,
                name: name.clone(),
                size: size_of(&snapshot),
                path: snapshot.clone(),
            });
            continue;
        }
        for file in entries(&snapshot).into_iter().filter(|p| is_gguf(p)) {
            found.push(FoundModel {
                source: FoundSource::HuggingFaceCache,
                name: format!("{name}/{}", name_of(&file)),
                size: size_of(&file),
                path: file,
            });
        }
    }
    found
}

fn lm_studio(root: &Path) -> Vec<FoundModel> {
    let mut found = Vec::new();
    for publisher in entries(root).into_iter().filter(|p| p.is_dir()) {
        for model in entries(&publisher).into_iter().filter(|p| p.is_dir()) {
            for file in entries(&model).into_iter().filter(|p| is_gguf(p)) {
                // Vision projectors sit beside the weights; they are not models of their own.
                if name_of(&file).to_ascii_lowercase().starts_with("mmproj") {
                    continue;
                }
                found.push(FoundModel {
                    source: FoundSource::LmStudio,
                    name: format!(
                        "{}/{}/{}",
                        name_of(&publisher),
                        name_of(&model),
                        name_of(&file)
                    ),
                    size: size_of(&file),
                    path: file,
                });
            }
        }
    }
    found
}

/// The GGUF blob an Ollama manifest names, if it is there.
fn ollama_model_blob(root: &Path, manifest: &Path) -> Option<PathBuf> {
    let bytes = std::fs::read(manifest).ok()?;
    if bytes.len() > 1 << 20 {
        return None;
    }
    let json: Value = serde_json::from_slice(&bytes).ok()?;
    let digest = json.get("layers")?.as_array()?.iter().find_map(|layer| {
        (layer.get("mediaType")?.as_str()? == "application/vnd.ollama.image.model")
            .then(|| layer.get("digest")?.as_str())
            .flatten()
    })?;
    let hex = digest.strip_prefix("sha256:")?;
    if hex.is_empty() || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    let blob = root.join("blobs").join(format!("sha256-{hex}"));
    blob.is_file().then_some(blob)
}

fn ollama(root: &Path) -> Vec<FoundModel> {
    let mut found = Vec::new();
    for host in entries(&root.join("manifests")) {
        for namespace in entries(&host) {
            for model in entries(&namespace) {
                for tag in entries(&model).into_iter().filter(|p| p.is_file()) {
                    let Some(blob) = ollama_model_blob(root, &tag) else {
                        continue;
                    };
                    // The default registry's `library` namespace is left out of names, as
                    // `ollama list` does.
                    let mut name = format!("{}:{}", name_of(&model), name_of(&tag));
                    if name_of(&namespace) != "library" {
                        name = format!("{}/{name}", name_of(&namespace));
                    }
                    found.push(FoundModel {
                        source: FoundSource::Ollama,
                        name,
                        size: size_of(&blob),
                        path: blob,
                    });
                }
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(path: &Path, bytes: &[u8]) {
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, bytes).expect("write");
    }

    #[test]
    fn each_tools_layout_is_found() {
        let root = std::env::temp_dir().join(format!("backpack-found-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let hub = root.join("hf/hub");
        // A transformers repo: files in blobs/, the snapshot of refs/main links to them.
        let repo = hub.join("models--HuggingFaceTB--SmolLM2-135M-Instruct");
        write(&repo.join("refs/main"), b"abc123\n");
        write(&repo.join("blobs/1111"), b"{}");
        write(&repo.join("blobs/2222"), &[0u8; 100]);
        let snapshot = repo.join("snapshots/abc123");
        std::fs::create_dir_all(&snapshot).expect("mkdir");
        #[cfg(unix)]
        {
            std::os::unix::fs::symlink("../../blobs/1111", snapshot.join("config.json"))
                .expect("link");
            std::os::unix::fs::symlink("../../blobs/2222", snapshot.join("model.safetensors"))
                .expect("link");
        }
        #[cfg(not(unix))]
        {
            write(&snapshot.join("config.json"), b"{}");
            write(&snapshot.join("model.safetensors"), &[0u8; 100]);
        }
        // A GGUF repo, and one whose download never finished (no snapshot files).
        write(
            &hub.join("models--bartowski--Llama-3.2-1B-Instruct-GGUF/snapshots/def/Llama-3.2-1B-Instruct-Q4_K_M.gguf"),
            b"GGUF",
        );
        write(&hub.join("models--x--partial/blobs/33.incomplete"), b"");
        write(&hub.join("datasets--x--y/snapshots/a/data.json"), b"{}");
        // LM Studio and Ollama.
        let lms = root.join("lmstudio");
        write(
            &lms.join("lmstudio-community/Qwen3-4B-GGUF/Qwen3-4B-Q4_K_M.gguf"),
            b"GGUF",
        );
        write(
            &lms.join("lmstudio-community/Qwen3-4B-GGUF/mmproj-f16.gguf"),
            b"GGUF",
        );
        let ol = root.join("ollama");
        let hex = "a".repeat(64);
        write(&ol.join(format!("blobs/sha256-{hex}")), b"GGUF....");
        write(
            &ol.join("manifests/registry.ollama.ai/library/llama3.2/1b"),
            format!(r#"{{"schemaVersion":2,"layers":[{{"mediaType":"application/vnd.ollama.image.template","digest":"sha256:{}","size":1}},{{"mediaType":"application/vnd.ollama.image.model","digest":"sha256:{hex}","size":8}}]}}"#, "b".repeat(64)).as_bytes(),
        );
        write(
            &ol.join("manifests/registry.ollama.ai/library/broken/latest"),
            b"{not json",
        );

        let found = SearchRoots {
            hf_cache: Some(hub),
            lm_studio: vec![lms, root.join("missing")],
            ollama: Some(ol.clone()),
        }
        .find();
        let names: Vec<(&str, FoundSource)> =
            found.iter().map(|f| (f.name.as_str(), f.source)).collect();
        assert_eq!(
            names,
            [
                (
                    "HuggingFaceTB/SmolLM2-135M-Instruct",
                    FoundSource::HuggingFaceCache
                ),
                (
                    "bartowski/Llama-3.2-1B-Instruct-GGUF/Llama-3.2-1B-Instruct-Q4_K_M.gguf",
                    FoundSource::HuggingFaceCache
                ),
                (
                    "lmstudio-community/Qwen3-4B-GGUF/Qwen3-4B-Q4_K_M.gguf",
                    FoundSource::LmStudio
                ),
                ("llama3.2:1b", FoundSource::Ollama),
            ]
        );
        assert_eq!(found[0].path, snapshot);
        assert_eq!(found[0].size, 102);
        assert_eq!(found[3].path, ol.join(format!("blobs/sha256-{hex}")));
        let _ = std::fs::remove_dir_all(&root);
    }
}
