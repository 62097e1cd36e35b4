//! The models folder: one folder per repo (`<root>/<owner>/<name>`), each with a manifest of
//! the verified files it holds.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{HubError, partial_dir, valid_repo_id};

pub(crate) const MANIFEST: &str = ".backpack-manifest.json";

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestFile {
    pub path: String,
    pub size: u64,
    pub sha256: Option<String>,
}

/// What a model folder holds and where it came from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub repo: String,
    pub revision: String,
    pub commit: String,
    pub files: Vec<ManifestFile>,
}

impl Manifest {
    pub fn read(dir: &Path) -> Option<Self> {
        let bytes = std::fs::read(dir.join(MANIFEST)).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    pub(crate) fn write(&self, dir: &Path) -> Result<(), HubError> {
        let path = dir.join(MANIFEST);
        let tmp = dir.join(format!("{MANIFEST}.tmp"));
        let bytes = serde_json::to_vec_pretty(self)
            .map_err(|e| HubError::Invalid(format!("manifest: {e}")))?;
        std::fs::create_dir_all(dir).map_err(|e| HubError::io(dir, e))?;
        std::fs::write(&tmp, bytes).map_err(|e| HubError::io(&tmp, e))?;
        std::fs::rename(&tmp, &path).map_err(|e| HubError::io(&path, e))
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstalledModel {
    pub repo: String,
    pub dir: PathBuf,
    pub manifest: Manifest,
    /// Bytes the folder takes on disk.
    pub size: u64,
}

impl InstalledModel {
    /// What `--model` should open: the folder for safetensors models, the newest `.gguf` file
    /// when the folder holds several quantizations.
    pub fn model_path(&self) -> PathBuf {
        let ggufs: Vec<&ManifestFile> = self
            .manifest
            .files
            .iter()
            .filter(|f| f.path.ends_with(".gguf") && !f.path.contains('/'))
            .collect();
        if self.dir.join("config.json").is_file() || ggufs.len() <= 1 {
            return self.dir.clone();
        }
        // The manifest lists files in the order they were installed.
        ggufs
            .last()
            .map_or_else(|| self.dir.clone(), |f| self.dir.join(&f.path))
    }
}

/// The local model library.
#[derive(Clone, Debug)]
pub struct Library {
    pub root: PathBuf,
}

fn dir_size(path: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(path) else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_size(&e.path()),
            Ok(_) => e.metadata().map_or(0, |m| m.len()),
            Err(_) => 0,
        })
        .sum()
}

impl Library {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// The folder a repo is installed into.
    pub fn dir_for(&self, repo: &str) -> Result<PathBuf, HubError> {
        if !valid_repo_id(repo) {
            return Err(HubError::Invalid(format!(
                "{repo:?} is not a repo id (expected owner/name)"
            )));
        }
        Ok(self.root.join(repo))
    }

    /// Installed models (folders with a manifest), sorted by repo id.
    pub fn list(&self) -> Vec<InstalledModel> {
        let mut out = Vec::new();
        let Ok(owners) = std::fs::read_dir(&self.root) else {
            return out;
        };
        for owner in owners.filter_map(Result::ok) {
            if owner.file_name().to_string_lossy().starts_with('.') {
                continue;
            }
            let Ok(names) = std::fs::read_dir(owner.path()) else {
                continue;
            };
            for name in names.filter_map(Result::ok) {
                let dir = name.path();
                if let Some(manifest) = Manifest::read(&dir) {
                    out.push(InstalledModel {
                        repo: manifest.repo.clone(),
                        size: dir_size(&dir),
                        dir,
                        manifest,
                    });
                }
            }
        }
        out.sort_by(|a, b| a.repo.cmp(&b.repo));
        out
    }

    pub fn find(&self, repo: &str) -> Option<InstalledModel> {
        self.list().into_iter().find(|m| m.repo == repo)
    }

    /// Deletes an installed model (and any partial download of it). False if not installed.
    pub fn remove(&self, repo: &str) -> Result<bool, HubError> {
        let dir = self.dir_for(repo)?;
        let partial = partial_dir(&dir);
        if partial.exists() {
            std::fs::remove_dir_all(&partial).map_err(|e| HubError::io(&partial, e))?;
        }
        if Manifest::read(&dir).is_none() {
            return Ok(false);
        }
        std::fs::remove_dir_all(&dir).map_err(|e| HubError::io(&dir, e))?;
        if let Some(owner) = dir.parent() {
            let _ = std::fs::remove_dir(owner);
        }
        Ok(true)
    }
}
