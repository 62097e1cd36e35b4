//! Downloads that survive anything: every file streams into a partial file outside the model
//! folder, resumes from where it stopped (HTTP Range) after a dropped connection, a stall or a
//! pause, is verified against the hub's hash (SHA-256 for LFS files, the git blob id for the
//! rest); once every file of the download is verified they are all moved into the model folder.
//! Cancelling removes the partial files, so nothing is left behind; pausing keeps them.

use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use sha1::Digest;

use super::client::{check_status, http_error};
use super::library::{Manifest, ManifestFile};
use super::{HubClient, HubError, RepoFile};

/// Attempts per file without any progress before giving up.
const MAX_ATTEMPTS: u32 = 6;
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Progress events at most this often.
const PROGRESS_EVERY: Duration = Duration::from_millis(100);

const RUNNING: u8 = 0;
const PAUSE: u8 = 1;
const CANCEL: u8 = 2;

/// Pause and cancel a running download from another task or thread.
#[derive(Clone, Default)]
pub struct DownloadControl(Arc<AtomicU8>);

impl DownloadControl {
    pub fn pause(&self) {
        let _ = self
            .0
            .compare_exchange(RUNNING, PAUSE, Ordering::AcqRel, Ordering::Acquire);
    }

    pub fn cancel(&self) {
        self.0.store(CANCEL, Ordering::Release);
    }

    /// Clears a pause, so the same control can drive the resumed download.
    pub fn resume(&self) {
        let _ = self
            .0
            .compare_exchange(PAUSE, RUNNING, Ordering::AcqRel, Ordering::Acquire);
    }

    fn check(&self) -> Result<(), HubError> {
        match self.0.load(Ordering::Acquire) {
            PAUSE => Err(HubError::Paused),
            CANCEL => Err(HubError::Cancelled),
            _ => Ok(()),
        }
    }
}

/// What to fetch and where: files of one repo at one commit, into `dest`.
#[derive(Clone, Debug)]
pub struct DownloadPlan {
    pub repo: String,
    pub revision: String,
    pub commit: String,
    pub files: Vec<RepoFile>,
    /// The model folder (`<models>/<owner>/<name>`).
    pub dest: PathBuf,
}

impl DownloadPlan {
    pub fn total_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.size).sum()
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct DownloadProgress {
    pub file: String,
    pub file_done: u64,
    pub file_total: u64,
    pub done: u64,
    pub total: u64,
    /// Recent transfer speed.
    pub bytes_per_s: f64,
    pub eta: Option<Duration>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum DownloadEvent {
    Progress(DownloadProgress),
    /// A transfer failed and will be tried again, resuming.
    Retrying {
        file: String,
        attempt: u32,
        delay: Duration,
        reason: String,
    },
    /// A file passed its hash check and has its final name.
    Verified {
        file: String,
    },
}

/// Where partial files of downloads into `dest` live: beside the model folders, not in them,
/// so a half-fetched file is never mistaken for a model file.
pub fn partial_dir(dest: &Path) -> PathBuf {
    let name = dest
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let owner = dest
        .parent()
        .and_then(Path::file_name)
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let root = dest.parent().and_then(Path::parent).unwrap_or(dest);
    root.join(".partial").join(format!("{owner}--{name}"))
}

/// The partial file of `file`, and a note of which exact content it holds (so a partial file
/// of another version is never resumed).
fn partial_paths(dest: &Path, file: &RepoFile) -> (PathBuf, PathBuf) {
    let flat = file.path.replace('/', "--");
    let dir = partial_dir(dest);
    (
        dir.join(format!("{flat}.part")),
        dir.join(format!("{flat}.part.id")),
    )
}

fn content_id(file: &RepoFile) -> String {
    format!(
        "{} {} {}",
        file.size,
        file.sha256.as_deref().unwrap_or("-"),
        file.git_oid.as_deref().unwrap_or("-")
    )
}

/// Incremental hash of whichever kind the hub gives for this file.
enum Hasher {
    Sha256(sha2::Sha256),
    GitBlob(sha1::Sha1),
    None,
}

impl Hasher {
    fn new(file: &RepoFile) -> Self {
        if file.sha256.is_some() {
            Self::Sha256(sha2::Sha256::new())
        } else if file.git_oid.is_some() {
            let mut h = sha1::Sha1::new();
            h.update(format!("blob {}\0", file.size).as_bytes());
            Self::GitBlob(h)
        } else {
            Self::None
        }
    }

    fn update(&mut self, bytes: &[u8]) {
        match self {
            Self::Sha256(h) => h.update(bytes),
            Self::GitBlob(h) => h.update(bytes),
            Self::None => {}
        }
    }

    /// Checks the digest against the hub's; files without a hash are checked by size only.
    fn verify(self, file: &RepoFile) -> Result<(), HubError> {
        let hex = |bytes: &[u8]| bytes.iter().map(|b| format!("{b:02x}")).collect::<String>();
        let (algorithm, expected, actual) = match self {
            Self::Sha256(h) => ("SHA-256", file.sha256.clone(), hex(&h.finalize())),
            Self::GitBlob(h) => ("git blob id", file.git_oid.clone(), hex(&h.finalize())),
            Self::None => return Ok(()),
        };
        let expected = expected.unwrap_or_default();
        if actual == expected {
            Ok(())
        } else {
            Err(HubError::Checksum {
                file: file.path.clone(),
                algorithm,
                expected,
                actual,
            })
        }
    }
}

/// Speed over the last few seconds, for progress and ETA.
struct Meter {
    samples: std::collections::VecDeque<(Instant, u64)>,
}

impl Meter {
    fn new(done: u64) -> Self {
        Self {
            samples: [(Instant::now(), done)].into(),
        }
    }

    fn rate(&mut self, done: u64) -> f64 {
        let now = Instant::now();
        self.samples.push_back((now, done));
        while self.samples.len() > 2
            && now.duration_since(self.samples[0].0) > Duration::from_secs(5)
        {
            self.samples.pop_front();
        }
        let (t0, d0) = self.samples[0];
        let secs = now.duration_since(t0).as_secs_f64();
        if secs > 0.0 {
            done.saturating_sub(d0) as f64 / secs
        } else {
            0.0
        }
    }
}

struct Run<'a> {
    client: &'a HubClient,
    plan: &'a DownloadPlan,
    control: &'a DownloadControl,
    done_before: u64,
    total: u64,
    meter: Meter,
    last_event: Instant,
}

/// Fetches every file of `plan` that is not already in place and verified, then moves them
/// all into the model folder at once and writes its manifest. Returns the model folder.
pub async fn download(
    client: &HubClient,
    plan: &DownloadPlan,
    control: &DownloadControl,
    mut on_event: impl FnMut(DownloadEvent),
) -> Result<PathBuf, HubError> {
    let result = download_inner(client, plan, control, &mut on_event).await;
    if matches!(result, Err(HubError::Cancelled)) {
        // Nothing reached the model folder yet: dropping the partial files leaves no trace.
        let partial = partial_dir(&plan.dest);
        let _ = std::fs::remove_dir_all(&partial);
        if let Some(root) = partial.parent() {
            let _ = std::fs::remove_dir(root);
        }
    }
    result
}

/// Marks a partial file as complete and verified, so a resumed download does not fetch or
/// hash it again.
fn verified_marker(id_path: &Path) -> PathBuf {
    id_path.with_extension("verified")
}

async fn download_inner(
    client: &HubClient,
    plan: &DownloadPlan,
    control: &DownloadControl,
    on_event: &mut impl FnMut(DownloadEvent),
) -> Result<PathBuf, HubError> {
    let mut manifest = Manifest::read(&plan.dest).unwrap_or_else(|| Manifest {
        repo: plan.repo.clone(),
        revision: plan.revision.clone(),
        commit: plan.commit.clone(),
        files: Vec::new(),
    });
    let mut run = Run {
        client,
        plan,
        control,
        done_before: 0,
        total: plan.total_bytes(),
        meter: Meter::new(0),
        last_event: Instant::now() - PROGRESS_EVERY,
    };
    let mut fetched = Vec::new();
    for file in &plan.files {
        control.check()?;
        let final_path = plan.dest.join(&file.path);
        let in_place = manifest
            .files
            .iter()
            .any(|m| m.path == file.path && m.sha256 == file.sha256 && m.size == file.size)
            && std::fs::metadata(&final_path).is_ok_and(|m| m.len() == file.size);
        if !in_place {
            let (_, id_path) = partial_paths(&plan.dest, file);
            let marker = verified_marker(&id_path);
            let verified = std::fs::read_to_string(&marker).ok() == Some(content_id(file));
            if !verified {
                fetch_file(&mut run, file, on_event).await?;
                std::fs::write(&marker, content_id(file)).map_err(|e| HubError::io(&marker, e))?;
            }
            on_event(DownloadEvent::Verified {
                file: file.path.clone(),
            });
            fetched.push(file);
        }
        run.done_before += file.size;
    }
    control.check()?;
    // Every file is verified: give them their final names.
    for file in fetched {
        let (part, id_path) = partial_paths(&plan.dest, file);
        let final_path = plan.dest.join(&file.path);
        if let Some(dir) = final_path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| HubError::io(dir, e))?;
        }
        std::fs::rename(&part, &final_path).map_err(|e| HubError::io(&final_path, e))?;
        let _ = std::fs::remove_file(verified_marker(&id_path));
        let _ = std::fs::remove_file(&id_path);
        manifest.files.retain(|m| m.path != file.path);
        manifest.files.push(ManifestFile {
            path: file.path.clone(),
            size: file.size,
            sha256: file.sha256.clone(),
        });
    }
    manifest.commit = plan.commit.clone();
    manifest.revision = plan.revision.clone();
    manifest.write(&plan.dest)?;
    let partial = partial_dir(&plan.dest);
    let _ = std::fs::remove_dir_all(&partial);
    if let Some(root) = partial.parent() {
        let _ = std::fs::remove_dir(root);
    }
    Ok(plan.dest.clone())
}

/// Brings the partial file of `file` to its full, verified content.
async fn fetch_file(
    run: &mut Run<'_>,
    file: &RepoFile,
    on_event: &mut impl FnMut(DownloadEvent),
) -> Result<(), HubError> {
    let (part, id_path) = partial_paths(&run.plan.dest, file);
    let dir = part.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(|e| HubError::io(dir, e))?;
    // A partial file of different content (a new commit) starts over.
    let id = content_id(file);
    if std::fs::read_to_string(&id_path).ok().as_deref() != Some(id.as_str()) {
        let _ = std::fs::remove_file(&part);
        std::fs::write(&id_path, &id).map_err(|e| HubError::io(&id_path, e))?;
    }
    let mut attempt = 0u32;
    let mut corrupt_once = false;
    loop {
        run.control.check()?;
        let before = std::fs::metadata(&part).map_or(0, |m| m.len());
        match transfer(run, file, &part, on_event).await {
            Ok(()) => {}
            Err(e) if e.is_transient() => {
                let now = std::fs::metadata(&part).map_or(0, |m| m.len());
                // Progress resets the count: only a transfer that keeps failing gives up.
                attempt = if now > before { 1 } else { attempt + 1 };
                if attempt > MAX_ATTEMPTS {
                    return Err(e);
                }
                let delay = MAX_BACKOFF.min(Duration::from_millis(500) * 2u32.pow(attempt - 1));
                on_event(DownloadEvent::Retrying {
                    file: file.path.clone(),
                    attempt,
                    delay,
                    reason: e.to_string(),
                });
                sleep_unless_stopped(run.control, delay).await?;
                continue;
            }
            Err(e) => return Err(e),
        }
        // Complete: verify the whole file (resumed files were written over several runs).
        match verify_file(&part, file) {
            Ok(()) => return Ok(()),
            Err(e @ HubError::Checksum { .. }) if !corrupt_once => {
                // A corrupted transfer: fetch it once more from scratch.
                corrupt_once = true;
                let _ = std::fs::remove_file(&part);
                on_event(DownloadEvent::Retrying {
                    file: file.path.clone(),
                    attempt: 1,
                    delay: Duration::ZERO,
                    reason: e.to_string(),
                });
            }
            Err(e) => {
                let _ = std::fs::remove_file(&part);
                return Err(e);
            }
        }
    }
}

async fn sleep_unless_stopped(control: &DownloadControl, delay: Duration) -> Result<(), HubError> {
    let end = Instant::now() + delay;
    while Instant::now() < end {
        control.check()?;
        tokio::time::sleep(Duration::from_millis(50).min(end - Instant::now())).await;
    }
    control.check()
}

fn verify_file(part: &Path, file: &RepoFile) -> Result<(), HubError> {
    let mut f = std::fs::File::open(part).map_err(|e| HubError::io(part, e))?;
    let len = f.metadata().map_err(|e| HubError::io(part, e))?.len();
    if len != file.size {
        return Err(HubError::Size {
            file: file.path.clone(),
            expected: file.size,
            got: len,
        });
    }
    let mut hasher = Hasher::new(file);
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(|e| HubError::io(part, e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    hasher.verify(file)
}

/// One HTTP transfer: appends to the partial file from its current length.
async fn transfer(
    run: &mut Run<'_>,
    file: &RepoFile,
    part: &Path,
    on_event: &mut impl FnMut(DownloadEvent),
) -> Result<(), HubError> {
    let mut out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(part)
        .map_err(|e| HubError::io(part, e))?;
    let mut have = out.metadata().map_err(|e| HubError::io(part, e))?.len();
    if have > file.size {
        out.set_len(0).map_err(|e| HubError::io(part, e))?;
        have = 0;
    }
    if have == file.size {
        return Ok(());
    }
    let url = run
        .client
        .resolve_url(&run.plan.repo, &run.plan.commit, &file.path);
    let response = run
        .client
        .request(&url, (have > 0).then_some(have))
        .send()
        .await
        .map_err(|e| http_error(&url, &e))?;
    let response = check_status(response, &url, &run.plan.repo)?;
    if have > 0 {
        // Resuming needs the server to start where the partial file ends.
        let start = response
            .headers()
            .get(reqwest::header::CONTENT_RANGE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("bytes "))
            .and_then(|v| v.split('-').next())
            .and_then(|v| v.parse::<u64>().ok());
        if response.status() != reqwest::StatusCode::PARTIAL_CONTENT || start != Some(have) {
            // The whole file came back instead: start over from this response.
            out.set_len(0).map_err(|e| HubError::io(part, e))?;
            out.seek(std::io::SeekFrom::Start(0))
                .map_err(|e| HubError::io(part, e))?;
            have = 0;
        }
    }
    let mut stream = response.bytes_stream();
    while let Some(chunk) = stream.next().await {
        run.control.check()?;
        let chunk = chunk.map_err(|e| http_error(&url, &e))?;
        if have + chunk.len() as u64 > file.size {
            out.set_len(0).map_err(|e| HubError::io(part, e))?;
            return Err(HubError::Size {
                file: file.path.clone(),
                expected: file.size,
                got: have + chunk.len() as u64,
            });
        }
        out.write_all(&chunk).map_err(|e| HubError::io(part, e))?;
        have += chunk.len() as u64;
        if run.last_event.elapsed() >= PROGRESS_EVERY || have == file.size {
            run.last_event = Instant::now();
            let done = run.done_before + have;
            let rate = run.meter.rate(done);
            on_event(DownloadEvent::Progress(DownloadProgress {
                file: file.path.clone(),
                file_done: have,
                file_total: file.size,
                done,
                total: run.total,
                bytes_per_s: rate,
                eta: (rate > 0.0)
                    .then(|| Duration::from_secs_f64(run.total.saturating_sub(done) as f64 / rate)),
            }));
        }
    }
    out.sync_all().map_err(|e| HubError::io(part, e))?;
    if have < file.size {
        return Err(HubError::Size {
            file: file.path.clone(),
            expected: file.size,
            got: have,
        });
    }
    Ok(())
}
