//! Talking to the hub over its HTTP API: search, repo info, the file listing (sizes and LFS
//! hashes) and file bodies. Four JSON-or-bytes requests on reqwest; the `hf-hub` crate would
//! add its storage client (about 75 crates, minutes of every cold build) for two of them.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use super::answers::{next_link, parse_revision, parse_search, parse_tree_page};
use super::{HubError, valid_repo_id};

const DEFAULT_ENDPOINT: &str = "https://huggingface.co";
/// The most tree pages one listing follows (the hub sends 1,000 entries a page).
const MAX_TREE_PAGES: usize = 1000;
/// The largest JSON answer read: a tree page of 1,000 entries is about 300 KB.
const MAX_JSON_BYTES: u64 = 64 << 20;

/// One search result.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelSummary {
    pub id: String,
    pub downloads: Option<u64>,
    pub likes: Option<u64>,
    pub pipeline_tag: Option<String>,
    pub gated: bool,
}

/// A file of a repo at one commit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepoFile {
    pub path: String,
    pub size: u64,
    /// SHA-256 of the content, for files stored with Git LFS (every weight file).
    pub sha256: Option<String>,
    /// Git blob id (SHA-1 of "blob <size>\0" + content), for the other files.
    pub git_oid: Option<String>,
}

/// What a repo holds at one commit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepoListing {
    pub repo: String,
    /// The commit the listing (and any download from it) is pinned to.
    pub commit: String,
    pub files: Vec<RepoFile>,
    pub gated: bool,
}

impl RepoListing {
    pub fn file(&self, path: &str) -> Option<&RepoFile> {
        self.files.iter().find(|f| f.path == path)
    }

    pub fn total_size(&self) -> u64 {
        self.files.iter().map(|f| f.size).sum()
    }
}

/// The quantization a GGUF file name states (`…-Q4_K_M.gguf` → `Q4_K_M`), upper-cased.
pub fn quant_label(path: &str) -> Option<String> {
    let name = path.rsplit('/').next()?;
    let stem = name
        .strip_suffix(".gguf")
        .or_else(|| name.strip_suffix(".GGUF"))?;
    let is_quant = |seg: &str| {
        let s = seg.to_ascii_uppercase();
        let q = s.strip_prefix('I').unwrap_or(&s);
        matches!(s.as_str(), "F16" | "BF16" | "F32" | "FP16" | "FP32")
            || (q.starts_with('Q')
                && q.len() >= 2
                && q.as_bytes()[1].is_ascii_digit()
                && q.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
    };
    stem.split(['-', '.'])
        .rev()
        .find(|seg| is_quant(seg))
        .map(str::to_ascii_uppercase)
}

/// GGUF files grouped by quantization (shards of one variant stay together), ordered by size.
pub fn quant_variants(files: &[RepoFile]) -> Vec<(String, Vec<RepoFile>)> {
    let mut groups: BTreeMap<String, Vec<RepoFile>> = BTreeMap::new();
    for f in files {
        if let Some(label) = quant_label(&f.path) {
            groups.entry(label).or_default().push(f.clone());
        }
    }
    let mut out: Vec<(String, Vec<RepoFile>)> = groups.into_iter().collect();
    out.sort_by_key(|(_, files)| files.iter().map(|f| f.size).sum::<u64>());
    out
}

/// The hub: endpoint, token, and the HTTP clients for metadata and file bodies.
#[derive(Clone)]
pub struct HubClient {
    endpoint: String,
    token: Option<String>,
    http: reqwest::Client,
}

impl HubClient {
    /// `endpoint` defaults to `HF_ENDPOINT`, then huggingface.co; `token` to `HF_TOKEN`.
    pub fn new(endpoint: Option<String>, token: Option<String>) -> Result<Self, HubError> {
        Self::with_read_timeout(endpoint, token, Duration::from_secs(30))
    }

    /// As [`Self::new`]; a transfer that receives nothing for `read_timeout` is retried.
    pub fn with_read_timeout(
        endpoint: Option<String>,
        token: Option<String>,
        read_timeout: Duration,
    ) -> Result<Self, HubError> {
        let endpoint = endpoint
            .or_else(|| std::env::var("HF_ENDPOINT").ok())
            .filter(|e| !e.trim().is_empty())
            .unwrap_or_else(|| DEFAULT_ENDPOINT.to_owned())
            .trim_end_matches('/')
            .to_owned();
        let token = token
            .or_else(|| std::env::var("HF_TOKEN").ok())
            .filter(|t| !t.trim().is_empty());
        let invalid = |e: &dyn std::fmt::Display| HubError::Invalid(format!("HTTP client: {e}"));
        let http = crate::http::client_builder()
            .user_agent(concat!("backpack/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(Duration::from_secs(15))
            // A stalled transfer is noticed and retried (resuming), however large the file.
            .read_timeout(read_timeout)
            .build()
            .map_err(|e| invalid(&e))?;
        Ok(Self {
            endpoint,
            token,
            http,
        })
    }

    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    pub fn has_token(&self) -> bool {
        self.token.is_some()
    }

    /// Models whose id (or card) matches `text`, most downloaded first.
    pub async fn search(&self, text: &str, limit: usize) -> Result<Vec<ModelSummary>, HubError> {
        let url = format!(
            "{}/api/models?search={}&sort=downloads&direction=-1&limit={limit}",
            self.endpoint,
            percent_encode(text)
        );
        let (body, _) = self.get_answer(&url, "the search").await?;
        let mut found = parse_search(&body).map_err(|detail| unexpected(&url, detail))?;
        found.truncate(limit);
        Ok(found)
    }

    /// The files of `repo` at `revision` (a branch, tag or commit), pinned to its commit.
    pub async fn listing(&self, repo: &str, revision: &str) -> Result<RepoListing, HubError> {
        if !valid_repo_id(repo) {
            return Err(HubError::Invalid(format!(
                "{repo:?} is not a repo id (expected owner/name)"
            )));
        }
        let info_url = format!(
            "{}/api/models/{repo}/revision/{}",
            self.endpoint,
            percent_encode(revision)
        );
        let (body, _) = self
            .get_answer(&info_url, repo)
            .await
            .map_err(|e| match e {
                HubError::NotFound { .. } => HubError::NotFound {
                    what: format!("{repo} at {revision}"),
                },
                other => other,
            })?;
        let info = parse_revision(&body).map_err(|detail| unexpected(&info_url, detail))?;
        let commit = info.commit.ok_or_else(|| {
            unexpected(
                &info_url,
                "the answer does not say which commit this is (no \"sha\")".into(),
            )
        })?;
        let gated = info.gated;
        // A gated repo's info and listing are public, its files are not: without a token the
        // download could only fail, file by file.
        if gated && self.token.is_none() {
            return Err(HubError::Gated { repo: repo.into() });
        }
        let mut url = format!(
            "{}/api/models/{repo}/tree/{commit}?recursive=true",
            self.endpoint
        );
        let mut files = Vec::new();
        // Large repos are listed a page at a time, the next page named by a `Link` header.
        for _ in 0..MAX_TREE_PAGES {
            let (body, next) = self.get_answer(&url, repo).await?;
            files.extend(parse_tree_page(&body).map_err(|detail| unexpected(&url, detail))?);
            match next {
                Some(next) => url = self.same_endpoint(&next, &url)?,
                None => {
                    files.sort_by(|a, b| a.path.cmp(&b.path));
                    files.dedup_by(|a, b| a.path == b.path);
                    return Ok(RepoListing {
                        repo: repo.to_owned(),
                        commit,
                        files,
                        gated,
                    });
                }
            }
        }
        Err(HubError::Unexpected {
            url,
            detail: format!("the listing did not end after {MAX_TREE_PAGES} pages"),
        })
    }

    /// A URL the hub handed out (a next page), absolute or relative, kept on this endpoint so
    /// that a token is never sent elsewhere.
    fn same_endpoint(&self, link: &str, from: &str) -> Result<String, HubError> {
        let absolute = if link.starts_with('/') {
            format!("{}{link}", origin(&self.endpoint))
        } else {
            link.to_owned()
        };
        if origin(&absolute) != origin(&self.endpoint) {
            return Err(HubError::Unexpected {
                url: from.to_owned(),
                detail: format!("the next page is on another server: {link}"),
            });
        }
        Ok(absolute)
    }

    /// GETs `url`: its body (bounded), with the next page's URL when the answer has one.
    async fn get_answer(
        &self,
        url: &str,
        repo: &str,
    ) -> Result<(Vec<u8>, Option<String>), HubError> {
        let response = self
            .request(url, None)
            .send()
            .await
            .map_err(|e| http_error(url, &e))?;
        let response = check_status(response, url, repo)?;
        let next = response
            .headers()
            .get_all(reqwest::header::LINK)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .find_map(next_link);
        if response
            .content_length()
            .is_some_and(|l| l > MAX_JSON_BYTES)
        {
            return Err(HubError::Unexpected {
                url: url.to_owned(),
                detail: format!("an answer of over {MAX_JSON_BYTES} bytes"),
            });
        }
        let mut body = Vec::new();
        let mut response = response;
        while let Some(chunk) = response.chunk().await.map_err(|e| http_error(url, &e))? {
            if body.len() + chunk.len() > MAX_JSON_BYTES as usize {
                return Err(HubError::Unexpected {
                    url: url.to_owned(),
                    detail: format!("an answer of over {MAX_JSON_BYTES} bytes"),
                });
            }
            body.extend_from_slice(&chunk);
        }
        Ok((body, next))
    }

    pub(crate) fn request(&self, url: &str, range_from: Option<u64>) -> reqwest::RequestBuilder {
        let mut r = self.http.get(url);
        if let Some(t) = &self.token {
            r = r.bearer_auth(t);
        }
        if let Some(from) = range_from {
            r = r.header(reqwest::header::RANGE, format!("bytes={from}-"));
        }
        r
    }

    /// Where a file's body is served, pinned to a commit.
    pub fn resolve_url(&self, repo: &str, commit: &str, path: &str) -> String {
        let encoded: Vec<String> = path.split('/').map(percent_encode).collect();
        format!(
            "{}/{repo}/resolve/{commit}/{}",
            self.endpoint,
            encoded.join("/")
        )
    }

    /// Fetches one small file (e.g. config.json) into memory.
    pub async fn fetch_small(
        &self,
        repo: &str,
        commit: &str,
        path: &str,
        max_bytes: u64,
    ) -> Result<Vec<u8>, HubError> {
        let url = self.resolve_url(repo, commit, path);
        let response = self
            .request(&url, None)
            .send()
            .await
            .map_err(|e| http_error(&url, &e))?;
        let response = check_status(response, &url, repo)?;
        if response.content_length().is_some_and(|l| l > max_bytes) {
            return Err(HubError::Invalid(format!(
                "{path} is larger than {max_bytes} bytes"
            )));
        }
        let bytes = response.bytes().await.map_err(|e| http_error(&url, &e))?;
        Ok(bytes.to_vec())
    }
}

fn percent_encode(segment: &str) -> String {
    let mut out = String::new();
    for b in segment.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out += &format!("%{b:02X}");
        }
    }
    out
}

fn unexpected(url: &str, detail: String) -> HubError {
    HubError::Unexpected {
        url: url.to_owned(),
        detail,
    }
}

/// `scheme://host[:port]` of a URL.
fn origin(url: &str) -> &str {
    let after_scheme = url.find("://").map_or(0, |i| i + 3);
    let end = url[after_scheme..]
        .find('/')
        .map_or(url.len(), |i| after_scheme + i);
    &url[..end]
}

/// A transport error. JSON answers are parsed apart from the transfer (see `get_answer`), so a
/// body or decode error here is a body cut short: reqwest reports a dropped stream as either.
pub(crate) fn http_error(url: &str, e: &reqwest::Error) -> HubError {
    HubError::Http {
        url: url.to_owned(),
        status: e.status().map(|s| s.as_u16()),
        message: if e.is_timeout() {
            "the server stopped responding".into()
        } else if e.is_connect() {
            "could not connect".into()
        } else if e.is_body() || e.is_decode() {
            "the connection dropped during the transfer".into()
        } else {
            e.to_string()
        },
    }
}

/// Maps error statuses to errors the user can act on. The hub names the cause in
/// `X-Error-Code` (`RepoNotFound`, `RevisionNotFound`, `EntryNotFound`, `GatedRepo`) and says it
/// in `X-Error-Message`; it answers 401 both for gated repos and for repos that do not exist
/// (or are private) when asked without a token, and only the code tells them apart.
pub(crate) fn check_status(
    response: reqwest::Response,
    url: &str,
    repo: &str,
) -> Result<reqwest::Response, HubError> {
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    Err(status_error(
        status.as_u16(),
        header("x-error-code").as_deref(),
        header("x-error-message").as_deref(),
        url,
        repo,
    ))
}

pub(crate) fn status_error(
    status: u16,
    code: Option<&str>,
    message: Option<&str>,
    url: &str,
    repo: &str,
) -> HubError {
    match (code, status) {
        (Some("GatedRepo"), _) => HubError::Gated { repo: repo.into() },
        (Some("RepoNotFound"), _) => HubError::NotFound {
            what: format!("{repo} ({url})"),
        },
        (Some("RevisionNotFound" | "EntryNotFound"), _) | (_, 404) => {
            HubError::NotFound { what: url.into() }
        }
        (_, 401 | 403) => HubError::Gated { repo: repo.into() },
        (_, s) => HubError::Http {
            url: url.into(),
            status: Some(s),
            message: match message {
                Some(m) if !m.trim().is_empty() => format!("the server answered {s}: {m}"),
                _ => format!("the server answered {s}"),
            },
        },
    }
}

/// Saves a hub token readable by its owner only.
pub fn store_token(path: &Path, token: &str) -> Result<(), HubError> {
    write_owner_only(path, token.trim().as_bytes()).map_err(|e| HubError::io(path, e))
}

/// Writes `bytes` to `path` (creating its folder) so that only the file's owner can read it:
/// for secrets such as tokens and API keys. Unix: mode 0600. Windows has no mode bits; the
/// files live in the user's profile (`%APPDATA%`), whose inherited ACL admits only the user,
/// SYSTEM and Administrators.
pub fn write_owner_only(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut f = options.open(path)?;
    // The mode only applies to new files; tighten an existing one too.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    }
    f.write_all(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str, size: u64) -> RepoFile {
        RepoFile {
            path: path.into(),
            size,
            sha256: None,
            git_oid: None,
        }
    }

    #[test]
    fn quant_labels_come_from_file_names() {
        assert_eq!(
            quant_label("qwen2.5-1.5b-instruct-q4_k_m.gguf").as_deref(),
            Some("Q4_K_M")
        );
        assert_eq!(
            quant_label("SmolLM2-135M-Instruct.Q4_1.gguf").as_deref(),
            Some("Q4_1")
        );
        assert_eq!(quant_label("model-f16.gguf").as_deref(), Some("F16"));
        assert_eq!(
            quant_label("big-Q8_0-00001-of-00002.gguf").as_deref(),
            Some("Q8_0")
        );
        assert_eq!(
            quant_label("Llama-3.2-1B-IQ4_XS.gguf").as_deref(),
            Some("IQ4_XS")
        );
        assert_eq!(quant_label("model.safetensors"), None);
    }

    #[test]
    fn variants_group_shards_and_sort_by_size() {
        let files = [
            file("m-Q8_0.gguf", 800),
            file("m-Q4_K_M-00001-of-00002.gguf", 200),
            file("m-Q4_K_M-00002-of-00002.gguf", 200),
            file("config.json", 1),
        ];
        let v = quant_variants(&files);
        assert_eq!(v.len(), 2);
        assert_eq!(v[0].0, "Q4_K_M");
        assert_eq!(v[0].1.len(), 2);
        assert_eq!(v[1].0, "Q8_0");
    }

    #[test]
    fn resolve_urls_encode_path_segments() {
        let c = HubClient::new(Some("http://127.0.0.1:9/".into()), None).expect("client");
        assert_eq!(
            c.resolve_url("o/n", "abc", "dir/a b+[1].gguf"),
            "http://127.0.0.1:9/o/n/resolve/abc/dir/a%20b%2B%5B1%5D.gguf"
        );
    }

    #[test]
    fn tokens_are_stored_owner_only() {
        let dir = std::env::temp_dir().join(format!("backpack-token-{}", std::process::id()));
        let path = dir.join("hf_token");
        store_token(&path, " hf_abc \n").expect("store");
        assert_eq!(std::fs::read_to_string(&path).expect("read"), "hf_abc");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).expect("meta").permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
