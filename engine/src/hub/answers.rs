//! The hub's JSON answers, read as the hub sends them (see `tests/conformance/hub/`): search
//! results, a revision's model info, and tree pages. Only the fields used are read; every other
//! field is ignored, and where real answers write a field more than one way, each way is read.

use serde::Deserialize;

use super::safe_relative_path;
use super::{ModelSummary, RepoFile};

/// The fields of `/api/models` and `/api/models/{repo}/revision/{rev}` answers used here.
/// The hub's answers carry `id` and `modelId` together (and `_id`, `author`, `cardData`,
/// `config`, `siblings`…); older answers and mirrors carry only one of the two names, so both
/// are read.
#[derive(Deserialize)]
struct ModelInfo {
    #[serde(default)]
    id: Option<String>,
    #[serde(default, rename = "modelId")]
    model_id: Option<String>,
    #[serde(default)]
    sha: Option<String>,
    #[serde(default, deserialize_with = "lenient_count")]
    downloads: Option<u64>,
    #[serde(default, deserialize_with = "lenient_count")]
    likes: Option<u64>,
    #[serde(default, deserialize_with = "lenient_string")]
    pipeline_tag: Option<String>,
    /// `false`, or the kind of gate (`"auto"`, `"manual"`).
    #[serde(default)]
    gated: Option<serde_json::Value>,
}

/// A count as a whole number; a float, a numeric string or null reads as that number or as
/// unknown rather than failing the whole answer.
fn lenient_count<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    Ok(match serde_json::Value::deserialize(d)? {
        serde_json::Value::Number(n) => n.as_u64().or_else(|| {
            n.as_f64()
                .filter(|f| f.is_finite() && *f >= 0.0)
                .map(|f| f as u64)
        }),
        serde_json::Value::String(s) => s.trim().parse().ok(),
        _ => None,
    })
}

fn lenient_string<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Ok(match serde_json::Value::deserialize(d)? {
        serde_json::Value::String(s) => Some(s),
        _ => None,
    })
}

impl ModelInfo {
    fn gated(&self) -> bool {
        match &self.gated {
            None | Some(serde_json::Value::Null | serde_json::Value::Bool(false)) => false,
            Some(serde_json::Value::String(s)) => !s.is_empty() && !s.eq_ignore_ascii_case("false"),
            Some(_) => true,
        }
    }

    fn repo_id(&self) -> Option<&str> {
        self.id
            .as_deref()
            .filter(|id| !id.is_empty())
            .or(self.model_id.as_deref())
            .filter(|id| !id.is_empty())
    }
}

#[derive(Deserialize)]
struct TreeEntry {
    #[serde(rename = "type")]
    kind: String,
    path: String,
    #[serde(default)]
    size: u64,
    #[serde(default)]
    oid: Option<String>,
    #[serde(default)]
    lfs: Option<TreeLfs>,
}

#[derive(Deserialize)]
struct TreeLfs {
    oid: String,
}

/// What a revision's model info says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RevisionInfo {
    /// The commit the revision is at (`sha`).
    pub commit: Option<String>,
    pub gated: bool,
}

/// Parses a JSON answer; the error names the field or value that did not fit and how the
/// answer began.
fn parse<T: for<'de> Deserialize<'de>>(body: &[u8]) -> Result<T, String> {
    serde_json::from_slice(body).map_err(|e| {
        let start: String = String::from_utf8_lossy(&body[..body.len().min(80)])
            .chars()
            .filter(|c| !c.is_control())
            .collect();
        format!("{e}; the answer began {start:?}")
    })
}

/// A `/api/models?search=…` answer: models without an id are skipped.
pub fn parse_search(body: &[u8]) -> Result<Vec<ModelSummary>, String> {
    let found: Vec<ModelInfo> = parse(body)?;
    Ok(found
        .into_iter()
        .filter_map(|info| {
            Some(ModelSummary {
                gated: info.gated(),
                id: info.repo_id()?.to_owned(),
                downloads: info.downloads,
                likes: info.likes,
                pipeline_tag: info.pipeline_tag,
            })
        })
        .collect())
}

/// A `/api/models/{repo}/revision/{rev}` (or `/api/models/{repo}`) answer.
pub fn parse_revision(body: &[u8]) -> Result<RevisionInfo, String> {
    let info: ModelInfo = parse(body)?;
    Ok(RevisionInfo {
        gated: info.gated(),
        commit: info.sha.filter(|sha| !sha.is_empty()),
    })
}

/// One page of `/api/models/{repo}/tree/{commit}?recursive=true`: its files (folders are
/// listed as entries of their own and skipped). A path that would leave the model's folder is
/// refused.
pub fn parse_tree_page(body: &[u8]) -> Result<Vec<RepoFile>, String> {
    let entries: Vec<TreeEntry> = parse(body)?;
    let mut files = Vec::new();
    for e in entries.into_iter().filter(|e| e.kind == "file") {
        if !safe_relative_path(&e.path) {
            return Err(format!("a file with an unsafe path: {:?}", e.path));
        }
        files.push(RepoFile {
            path: e.path,
            size: e.size,
            sha256: e.lfs.map(|l| l.oid.to_ascii_lowercase()),
            git_oid: e.oid.map(|o| o.to_ascii_lowercase()),
        });
    }
    Ok(files)
}

/// The `rel="next"` target of a `Link` header (RFC 8288), as the hub paginates listings:
/// `<https://huggingface.co/api/models/…/tree/main?recursive=true&cursor=…>; rel="next"`.
pub fn next_link(header: &str) -> Option<String> {
    header.split(',').find_map(|part| {
        let (target, params) = part.trim().split_once(';')?;
        let target = target.trim().strip_prefix('<')?.strip_suffix('>')?;
        let is_next = params.split(';').any(|p| {
            p.trim().strip_prefix("rel=").is_some_and(|rel| {
                rel.trim_matches('"')
                    .split_whitespace()
                    .any(|r| r.eq_ignore_ascii_case("next"))
            })
        });
        is_next.then(|| target.to_owned())
    })
}
