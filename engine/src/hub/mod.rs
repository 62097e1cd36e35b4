//! Models from the Hugging Face Hub: a curated catalog, search, repo listings with sizes and
//! hashes, downloads that resume and verify, the local model library, and "will it fit" checks
//! made before a byte is fetched.
//!
//! Metadata, search and file bodies go through the hub's HTTP API on `reqwest`: a download here
//! must resume from a partial file (HTTP Range), be paused and cancelled, report its speed, and
//! be verified against the hub's hashes before it gets its final name.

mod answers;
mod catalog;
mod client;
mod download;
mod fit;
mod found;
mod library;

use std::path::PathBuf;

use thiserror::Error;

pub use answers::{RevisionInfo, next_link, parse_revision, parse_search, parse_tree_page};
pub use catalog::{
    Catalog, CatalogEntry, CatalogVariant, ESTIMATE_CONTEXT, ModelShape, glob_match,
};
pub use client::{
    HubClient, ModelSummary, RepoFile, RepoListing, quant_label, quant_variants, store_token,
    write_owner_only,
};
pub use download::{
    DownloadControl, DownloadEvent, DownloadPlan, DownloadProgress, download, partial_dir,
};
pub use fit::{FitCheck, FitProblem, GpuBudget, free_disk_space, system_memory};
pub use found::{FoundModel, FoundSource, SearchRoots};
pub use library::{InstalledModel, Library, Manifest, ManifestFile};

#[derive(Debug, Error)]
pub enum HubError {
    #[error("{url}: {message}")]
    Http {
        url: String,
        status: Option<u16>,
        message: String,
    },
    #[error(
        "{repo} needs an access token: accept its license on the hub, then set HF_TOKEN or enter a token in Settings"
    )]
    Gated { repo: String },
    /// A body that arrived whole but is not what the hub's API sends.
    #[error("{url}: unexpected answer from the hub ({detail})")]
    Unexpected { url: String, detail: String },
    #[error("{what} was not found on the hub")]
    NotFound { what: String },
    #[error("{path}: {message}")]
    Io { path: PathBuf, message: String },
    #[error("{file} is corrupt: expected {algorithm} {expected}, got {actual}")]
    Checksum {
        file: String,
        algorithm: &'static str,
        expected: String,
        actual: String,
    },
    #[error("{file}: the hub served {got} bytes where {expected} were expected")]
    Size {
        file: String,
        expected: u64,
        got: u64,
    },
    #[error(transparent)]
    DoesNotFit(#[from] FitProblem),
    #[error("the download was paused")]
    Paused,
    #[error("the download was cancelled")]
    Cancelled,
    #[error("{0}")]
    Invalid(String),
}

impl HubError {
    pub(crate) fn io(path: &std::path::Path, e: std::io::Error) -> Self {
        Self::Io {
            path: path.to_owned(),
            message: e.to_string(),
        }
    }

    /// Whether trying again later may succeed (network trouble, server errors, rate limits).
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Http { status, .. } => status.is_none_or(|s| s == 408 || s == 429 || s >= 500),
            Self::Size { .. } => true,
            _ => false,
        }
    }
}

/// `org/name` with safe characters only (it becomes a folder name).
pub fn valid_repo_id(repo: &str) -> bool {
    let mut parts = repo.split('/');
    let ok = |p: Option<&str>| {
        p.is_some_and(|p| {
            !p.is_empty()
                && p != "."
                && p != ".."
                && p.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        })
    };
    ok(parts.next()) && ok(parts.next()) && parts.next().is_none()
}

/// A repo-relative file path that stays inside its folder.
pub(crate) fn safe_relative_path(path: &str) -> bool {
    !path.is_empty()
        && !path.starts_with('/')
        && !path.contains('\\')
        && path
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != "..")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repo_ids_and_paths_are_checked() {
        assert!(valid_repo_id("HuggingFaceTB/SmolLM2-135M-Instruct"));
        assert!(!valid_repo_id("../etc"));
        assert!(!valid_repo_id("a/b/c"));
        assert!(!valid_repo_id("a/.."));
        assert!(safe_relative_path("onnx/model.onnx"));
        assert!(!safe_relative_path("../x"));
        assert!(!safe_relative_path("/abs"));
        assert!(!safe_relative_path("a//b"));
    }
}
